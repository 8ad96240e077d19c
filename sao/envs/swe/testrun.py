"""Running a repository's tests in the sandbox and grading an attempt.

``run_tests(files, spec)`` runs pytest once on a copy of ``files`` in a
fresh sandbox with ``--junitxml`` and returns per-test outcomes
(sao/envs/swe/junit.py). ``grade_files(entry, files)`` is the reward: the
task's starting repository plus the agent's changes to non-test files
(``overlay_editable``: test files and pytest config are restored, so editing
or deleting tests earns nothing), then 1.0 iff every FAIL_TO_PASS and
PASS_TO_PASS test passes.
"""
from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Mapping, Sequence

from sao.envs.swe.files import Files, changed_lines, overlay_editable
from sao.envs.swe.junit import PASSED, parse_report
from sao.envs.swe.workspace import ExecLimits, execute_files

REPORT = "/tmp/sao-junit.xml"


@dataclasses.dataclass(frozen=True)
class TestSpec:
    """How a repository's tests run.

    Attributes:
      pythonpath: ``PYTHONPATH`` relative to the repository root.
      pytest_args: extra arguments (after the fixed ones).
      test_files: limit the run to these paths (empty: pytest's own discovery).
      timeout_s: wall-clock limit of the whole run.
    """

    pythonpath: str = "."
    pytest_args: tuple[str, ...] = ()
    test_files: tuple[str, ...] = ()
    timeout_s: float = 120.0
    plugin_autoload: bool = False

    def env(self) -> dict[str, str]:
        """Environment of the run: ``PYTHONPATH``; plugin autoloading off
        unless asked for (third-party plugins of the host venv cost seconds
        of start-up per run and are not the package's)."""
        env = {"PYTHONPATH": self.pythonpath}
        if not self.plugin_autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return env

    def command(self) -> str:
        args = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                "-o", "junit_family=xunit1", f"--junitxml={REPORT}", *self.pytest_args,
                *self.test_files]
        return " ".join(shlex.quote(a) for a in args)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> "TestSpec":
        spec = entry.get("test_spec") or {}
        return cls(pythonpath=str(spec.get("pythonpath", ".")),
                   pytest_args=tuple(str(a) for a in spec.get("pytest_args", ())),
                   test_files=tuple(str(a) for a in spec.get("test_files", ())),
                   timeout_s=float(spec.get("timeout_s", 120.0)),
                   plugin_autoload=bool(spec.get("plugin_autoload", False)))

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"pytest_args": list(self.pytest_args),
                                           "test_files": list(self.test_files)}


@dataclasses.dataclass(frozen=True)
class TestRun:
    """Outcomes of one run: ``{node id: outcome}``, the console tail, the exit status."""

    outcomes: dict[str, str]
    output: str
    returncode: int | None
    timed_out: bool
    duration_s: float

    def passed(self) -> set[str]:
        return {t for t, o in self.outcomes.items() if o == PASSED}


def run_tests(files: Mapping[str, bytes], spec: TestSpec, *,
              limits: ExecLimits | None = None, setup: str = "",
              extra_files: Mapping[str, bytes] | None = None) -> TestRun:
    """Runs the tests of ``files`` once in a fresh sandbox (``setup``: a bash
    command run first, e.g. applying a test patch). Raises
    SandboxUnavailableError where the sandbox cannot run."""
    limits = limits or ExecLimits(timeout_s=spec.timeout_s, max_output_bytes=8192)
    command = spec.command()
    if setup:
        command = f"{setup} && {command}"
    res, after = execute_files(files, command, limits=limits, timeout_s=spec.timeout_s,
                               collect=REPORT, extra_files=extra_files,
                               env=spec.env())
    return TestRun(outcomes=parse_report(res.collected, after), output=res.output[-4000:],
                   returncode=res.returncode, timed_out=res.timed_out,
                   duration_s=res.duration_s)


def score(outcomes: Mapping[str, str], fail_to_pass: Sequence[str],
          pass_to_pass: Sequence[str]) -> dict[str, Any]:
    """Grading facts: ``correct`` (1.0 iff every listed test passed),
    ``tests_passed`` / ``tests_total`` over both lists, ``f2p_passed``."""
    f2p = sum(outcomes.get(t) == PASSED for t in fail_to_pass)
    p2p = sum(outcomes.get(t) == PASSED for t in pass_to_pass)
    total = len(fail_to_pass) + len(pass_to_pass)
    return {"correct": float(total > 0 and f2p + p2p == total), "tests_passed": f2p + p2p,
            "tests_total": total, "f2p_passed": f2p, "f2p_total": len(fail_to_pass)}


def grade_files(entry: Mapping[str, Any], start: Mapping[str, bytes],
                work: Mapping[str, bytes]) -> dict[str, Any]:
    """Grades an agent's final working copy ``work`` of a task whose starting
    repository is ``start``: runs the tests on ``overlay_editable(start,
    work, protected)`` in a fresh sandbox (after the entry's ``test_patch``,
    if any) and returns ``score(...)`` plus ``patch_lines`` (lines the agent
    changed in graded files) and ``test_s``."""
    graded: Files = overlay_editable(start, work, entry.get("protected_files", ()))
    setup, extra = "", None
    if entry.get("test_patch"):
        extra = {"sao_test.patch": str(entry["test_patch"]).encode()}
        setup = "git apply --whitespace=nowarn /tmp/sao_test.patch"
    run = run_tests(graded, TestSpec.from_entry(entry), setup=setup, extra_files=extra)
    facts = score(run.outcomes, entry["FAIL_TO_PASS"], entry["PASS_TO_PASS"])
    facts.update(patch_lines=changed_lines(start, graded), test_s=round(run.duration_s, 3))
    return facts
