"""Per-test outcomes from pytest's own report (``--junitxml``), not its console.

pytest writes a ``<testcase classname=... name=...>`` per test; a
``<failure>`` or ``<error>`` child means it failed, ``<skipped>`` that it was
skipped, none that it passed. The node id (``tests/test_x.py::TestA::test_b[1]``,
the form SWE-bench's FAIL_TO_PASS / PASS_TO_PASS lists use) is rebuilt from
the classname (the node id's path with ``/`` -> ``.`` and ``.py`` dropped,
then its classes) using the repository's own file list.

The report is written by a process that imports the code under test, so it
is untrusted: it is size-capped, a DOCTYPE / ENTITY declaration rejects it,
and a malformed report yields no outcomes (every required test then counts
as not passed).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Iterable

MAX_REPORT_BYTES = 32 * 2 ** 20

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def module_index(paths: Iterable[str]) -> dict[str, str]:
    """``{dotted module: path}`` for the ``.py`` files of a repository."""
    out = {}
    for path in paths:
        if path.endswith(".py"):
            out[path[:-3].replace("/", ".")] = path
    return out


def node_id(classname: str, name: str, modules: dict[str, str]) -> str:
    """The pytest node id of a junit test case (``modules`` from ``module_index``);
    falls back to ``classname::name`` when no file matches."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = modules.get(".".join(parts[:cut]))
        if path is not None:
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}" if classname else name


def parse_report(xml: bytes | str | None, repo_paths: Iterable[str]) -> dict[str, str]:
    """``{node id: "passed" | "failed" | "skipped"}`` from a junit XML report.

    A test reported more than once (e.g. a teardown error after a pass) keeps
    the worst outcome. Returns {} for a missing, oversized or malformed
    report, or one declaring a DOCTYPE / entities.
    """
    if not xml:
        return {}
    data = xml.encode() if isinstance(xml, str) else bytes(xml)
    if len(data) > MAX_REPORT_BYTES or b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        return {}
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return {}
    modules = module_index(repo_paths)
    rank = {PASSED: 0, SKIPPED: 1, FAILED: 2}
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        outcome = (FAILED if tags & {"failure", "error"} else SKIPPED if "skipped" in tags
                   else PASSED)
        nid = node_id(case.get("classname", ""), case.get("name", ""), modules)
        out[nid] = max(out.get(nid, outcome), outcome, key=rank.__getitem__)
    return out
