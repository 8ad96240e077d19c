"""Runs a launcher under the project's environment: ``python launch/x.py`` works outside ``.venv``.

A launcher loads the experiment config (``absl``, ``ml_collections``, ``jax``)
to check it before it starts anything. Started by an interpreter without
them, :func:`ensure` re-executes the same command with ``<repo>/.venv/bin/python``
when that exists, and otherwise exits with what to run (``make venv``).
Standard library only.
"""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NEEDED = ("absl", "ml_collections", "jax")


def ensure() -> None:
    """Returns when this interpreter has the packages; otherwise re-executes or exits (status 2)."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return
    venv = os.path.join(ROOT, ".venv")
    venv_python = os.path.join(venv, "bin", "python")
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(venv) \
            and not os.environ.get("SAO_LAUNCH_REEXEC"):
        os.environ["SAO_LAUNCH_REEXEC"] = "1"
        os.execv(venv_python, [venv_python, *sys.argv])
    sys.exit(f"{sys.argv[0]}: this Python ({sys.executable}) lacks {', '.join(missing)}; "
             f"run `make venv` in {ROOT} (creates .venv), then `.venv/bin/python {' '.join(sys.argv)}`")
