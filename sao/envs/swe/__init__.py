"""SWE-style repository tasks: a bugged Python package, tools, graded by its tests.

Public API (docs/envs.md, "Repository tasks"):

Tasks
  ``build_tier(tier, *, seed=0, per_repo=None, cache=None, download=True)``
      -> list of task entries (dicts); ``tier`` is ``"micro"`` (tiny packages
      committed in sao/envs/swe/micro/) or ``"source"`` (pinned PyPI sdists,
      ``SOURCES``); validated and cached by content hash.
  ``split_entries(entries, *, heldout_fraction, seed=0) -> (train, heldout)``
  ``load_instances(path, checkouts)`` -> entries of SWE-bench instances
      (JSON / JSONL) read from local git checkouts.
  ``SweTask(name, entries)`` (a ``sao.envs.Task``) and
  ``make_swe_task(spec, **kw)`` for ``"swe/micro"``, ``"swe/source"``,
      ``"swe/bench"`` (also reachable through ``sao.envs.make_task``).
  ``start_files(entry)`` -> the starting repository ``{path: bytes}``.

Episodes
  ``SweEnv(tasks, config: EpisodeConfig, limits: ExecLimits | None)``: an
      ``Env`` with bash / str_replace_editor / submit tools (formats
      ``"tags"`` and ``"hermes"``, ``TOOL_SCHEMAS``); reward 1 iff every
      FAIL_TO_PASS and PASS_TO_PASS test passes with the original tests.
  ``grade_files(entry, start, work)`` / ``grade_patch(entry, patch)``:
      grading facts (``correct``, ``tests_passed``, ``tests_total``, ...).

Sandboxed working copy (for harness adapters, e.g. mini-swe-agent)
  ``Workspace(files, limits=ExecLimits(...))`` with
  ``execute(command, cwd="", timeout=None) -> {"returncode", "output"}``,
  ``run(...) -> ExecResult`` and ``files``; ``REPO_DIR`` is the repository's
  path inside the sandbox; ``execute_files(files, command, ...)`` is the
  stateless form.

Demonstrations
  ``swe_demonstrations(entries, fmt="tags")`` -> scripted, graded
  ``sao.data.demonstrations.Demonstration``s of one-line micro bugs.

Importing this package is cheap; swesmith (the ``swe`` extra) is imported
only when bugs are generated.
"""
from sao.envs.swe.actions import TOOL_SCHEMAS, parse_action
from sao.envs.swe.build import TIERS, build_tier, split_entries
from sao.envs.swe.demos import swe_demonstrations
from sao.envs.swe.env import SweEnv
from sao.envs.swe.repos import start_files
from sao.envs.swe.sources import SOURCES, SourceUnavailableError
from sao.envs.swe.swebench import load_instances
from sao.envs.swe.task import SweTask, grade_patch, make_swe_task
from sao.envs.swe.testrun import TestSpec, grade_files, run_tests
from sao.envs.swe.workspace import REPO_DIR, ExecLimits, ExecResult, Workspace, execute_files

__all__ = ["REPO_DIR", "SOURCES", "TIERS", "TOOL_SCHEMAS", "ExecLimits", "ExecResult",
           "SourceUnavailableError", "SweEnv", "SweTask", "TestSpec", "Workspace",
           "build_tier", "execute_files", "grade_files", "grade_patch", "load_instances",
           "make_swe_task", "parse_action", "run_tests", "split_entries", "start_files",
           "swe_demonstrations"]
