"""Acceptance: a real ``python -m sao.main`` run (the tiny quick start,
``--role=learner``, synchronous: tau = 0) on a fleet of two worker processes
(hostile_fleet_worker.py): one answers with S1 rows (metadata of the wrong
type), S5 rows (a rollout log-prob of -1e30) and S4 rows (forged answers to
the other worker's leases) among good ones; the other takes leases and never
answers (S6). The run completes its steps and summary.json counts each drop
by reason and the quarantine. Slow: the learner's JAX start, SFT and
evaluations (the workers need no JAX)."""
import json
import os
import subprocess
import sys

import pytest

from sao.rpc import credentials

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from test_main_support import ROOT, run_main  # noqa: E402

LEASE_TIMEOUT_S = 10


def _start(mode: str, workdir: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "hostile_fleet_worker.py"), f"--mode={mode}",
         f"--token_file={os.path.join(workdir, 'fleet.token')}",
         f"--publish_root={os.path.join(workdir, 'publish')}",
         f"--lease_file={os.path.join(workdir, 'leases.txt')}"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"})
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{mode} worker did not start: {line!r}")
    return proc, line.split()[1]


@pytest.mark.slow
def test_a_run_with_a_hostile_and_a_hung_worker_completes_and_counts_each_drop(tmp_path):
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    credentials.ensure_token_file(workdir)  # the run's token, as the launchers make it first
    procs = []
    try:
        for mode in ("mixed", "hang"):
            procs.append(_start(mode, workdir))
        addresses = ",".join(address for _, address in procs)
        run = run_main(workdir, 3, "--role=learner", f"--config.rollout.worker_addresses={addresses}",
                       "--config.rollout.tau=0", "--config.eval.every=0",  # before/after only
                       f"--config.rollout.lease_timeout_s={LEASE_TIMEOUT_S}",
                       # simulated engines cannot score the parity gate's probe (docs/fleet.md)
                       "--config.rollout.parity.enabled=False")
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(10)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    print(json.dumps({k: summary[k] for k in ("steps", "trajectories", "dropped", "drops",
                                              "quarantined", "learner_nonfinite_skips",
                                              "wall_s")}))
    drops = summary["drops"]
    assert summary["steps"] == 3 and summary["trajectories"] == 24
    for reason in ("bad_metadata_num_tool_calls", "bad_metadata_drift",
                   "bad_metadata_tool_timeouts", "logprob_out_of_range", "foreign_lease"):
        assert drops.get(reason, 0) >= 1, (reason, drops)
    assert summary["dropped"] == sum(drops.values())
    assert summary["quarantined"] == 1 and summary["learner_nonfinite_skips"] == 0
