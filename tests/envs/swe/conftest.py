"""Shared fixtures of the SWE task tests: a few validated micro tasks, built
once per session (the full tiers are built by the slow test in test_build.py)."""
from __future__ import annotations

import pytest

from sao.envs.sandbox import sandbox_available


@pytest.fixture(scope="session")
def sandbox():
    if not sandbox_available():
        pytest.skip("no namespace sandbox here (test_sandbox_available_or_explicitly_waived "
                    "fails unless SAO_ALLOW_NO_SANDBOX=1)")


@pytest.fixture(scope="session")
def micro_entries(sandbox):
    """Two validated tasks of the micro package ``calc`` (seed 0)."""
    from sao.envs.swe.build import build_repo_tasks, tier_bases
    base = next(b for b in tier_bases("micro") if b.name == "calc")
    entries = build_repo_tasks(base, seed=0, n=2)
    assert len(entries) == 2
    return entries
