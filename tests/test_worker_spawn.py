"""Local rollout workers (``sao.workers.local_fleet``) must be serving within
``rollout.worker_start_timeout_s``, or the run stops and nothing it started is left."""
import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments import sao_math  # noqa: E402
from sao import workers  # noqa: E402


def test_workers_not_serving_by_the_configured_timeout_stop_the_run(tmp_path, monkeypatch):
    never_serves = tmp_path / "python"          # a "worker" that never writes its address
    never_serves.write_text("#!/bin/sh\necho $$ > \"$(dirname \"$0\")/pid\"\nexec sleep 60\n")
    never_serves.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(never_serves))
    cfg = sao_math.get_config("cpu")
    cfg.rollout.num_workers = 1
    cfg.rollout.worker_start_timeout_s = 1.5
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):
        with workers.local_fleet(cfg, str(tmp_path / "run"), []):
            pass
    assert time.monotonic() - t0 < 30              # the configured 1.5 s, not the default
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):        # the worker was stopped
        os.kill(pid, 0)
