"""Test session setup: CPU only, 8 fake devices for mesh tests, XLA compiling fast (tests/xla_flags.py)."""
import os

from xla_flags import FAST_COMPILE  # noqa: E402  (tests/ is on sys.path: rootdir conftest)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
for _flag in ("--xla_force_host_platform_device_count=8", FAST_COMPILE):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# XLA reads its flags once, when this process's backend starts: start it now, then take
# FAST_COMPILE out again, so the child processes tests start (runs that sample many
# tokens) run at XLA's defaults (tests/xla_flags.py).
import jax  # noqa: E402

jax.devices()
os.environ["XLA_FLAGS"] = " ".join(f for f in os.environ["XLA_FLAGS"].split() if f != FAST_COMPILE)


# `make test` runs on pytest-xdist workers (tests/README.md). A module's tests
# stay on one worker (its module fixtures and compiled functions are made once);
# the modules of one SHARED group share a per-process artefact and stay on one
# worker together. The memory lane starts first (see pytest_collection_modifyitems
# for the order of the rest). (xdist's own `xdist_group` mark
# does nothing under pytest 9.2: it renames `item._nodeid`, which pytest no longer
# reads.)
import pytest  # noqa: E402

MEMORY_LANE = "memory_lane"
SHARED = {
    "tiny_run": ("tests/test_main.py", "tests/notebooks/test_analyze_run_notebook.py",
                 "tests/notebooks/test_trajectory_viewer_notebook.py"),   # test_main_support
    "shared_learner": ("tests/learner/test_update.py", "tests/analysis/test_token_table.py",
                       "tests/test_ckpt.py"),                            # learner/helpers.py
    # Memory, not an artefact: the runs that hold a SmolLM2 learner (~5-8 GB plus a
    # ~1.8 GB worker) or SGLang servers and a fleet (~3 GB per real SGLang server). Two
    # at once went past this machine's 24 GB: the OOM killer ended one, or the kernel
    # reclaimed page cache until both ran 3-5x slower (CI, 2026-12-03: a 266 s fleet
    # run took 1301 s beside a SmolLM2 run). One lane runs them one after another
    # while the other workers take everything else (three under `make test`: peak
    # 18.0 GB used, 2026-12-03).
    MEMORY_LANE: ("tests/e2e/test_swe_runs.py", "tests/rollout/test_sglang_real_server.py"),
}
_GROUP_OF = {module: group for group, modules in SHARED.items() for module in modules}


def scope(nodeid: str) -> str:
    """The xdist work unit of a test: its SHARED group, else its module."""
    module = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(module, module)


def pytest_collection_modifyitems(config, items):
    """The memory lane first, its modules in ``SHARED`` order (the SmolLM2 run first, while
    the other worker runs short tests: beside a cluster-box run and two background jobs
    its ~9 GB learner met the OOM killer); then the short units, then the slow ones."""
    slow = {scope(item.nodeid) for item in items if item.get_closest_marker("slow")}
    order = {id(item): i for i, item in enumerate(items)}
    lane = SHARED[MEMORY_LANE]

    def key(item):
        module, unit = item.nodeid.split("::", 1)[0], scope(item.nodeid)
        if unit == MEMORY_LANE:
            return (0, lane.index(module), order[id(item)])
        return (1 + (unit in slow), 0, order[id(item)])
    items.sort(key=key)


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist, when installed
def pytest_xdist_make_scheduler(config, log):
    """``--dist load``, ``loadscope`` or ``loadgroup``: work units of :func:`scope`."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

        def schedule(self) -> None:
            # xdist reorders units by their number of tests unless told not to, which
            # put slow units anywhere (and the memory lane's runs beside each other's
            # rivals): keep the order of pytest_collection_modifyitems. Each worker
            # then takes the next unit when it has <= 2 tests left.
            self.config.option.loadscopereorder = False
            super().schedule()
    return SharedScopeScheduling(config, log)
