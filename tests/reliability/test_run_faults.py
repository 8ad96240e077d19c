"""A real tiny GRPO run (``python -m sao.main``, learner + 2 worker processes)
attacked and killed on purpose, then resumed (issue 14, findings 1, 4, 5).

One scenario, checked by the tests below (slow: two learner lives, ~5 min):

1. once RL starts, an intruder sends every worker the issue's attack, two
   ``UpdateWeights(version=10**6)`` without credentials;
2. worker 0 is SIGKILLed; ``--role=all`` must restart it on its port and the
   dispatcher must use it again;
3. worker 1 is held back on purpose (SIGSTOP; it runs only to take each
   weight push and to answer keepalives), so the groups with a member leased
   to it cannot complete while their other members reach the learner (without
   the hold the fleet runs in lockstep and few checkpoints hold groups in
   pieces; a fresh clone's run had none). The hold alone does not make every
   checkpoint hold one (the worker's episodes advance while it takes a push),
   so life 1 gets a budget of 10,000 steps, which it cannot reach before the
   wait for such a checkpoint gives up (900 s): a run ending before one came
   is no longer a way to fail. The lease timeout is raised past the test's
   length: the held worker must keep its leases, not be quarantined. The learner is frozen (SIGSTOP) as soon as its
   latest checkpoint holds one, then SIGKILLed, so no later checkpoint can
   slip in; its workers must exit with it;
4. the same command with ``run.steps`` raised to 3 past that checkpoint
   resumes from it and finishes the run.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_main_support import ROOT  # noqa: E402

from sao import run_metrics  # noqa: E402
from sao.rpc import auth, credentials, sao_pb2, sao_pb2_grpc  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]   # the scenario runs in the first test's setup
# Life 1's step budget is one the run cannot finish while the hold lasts (the wait for a
# checkpoint with groups in pieces is bounded in time, not by the run's end: at 20 steps a
# run could end before one came); life 2 is the same command with run.steps raised to AFTER
# steps past the checkpoint it resumes from (how a user extends or cuts a run).
LIFE1_STEPS, AFTER, B, G = 10_000, 3, 8, 4
ARGS = ["--config=experiments/grpo_math.py:cpu", "--config.sft.steps=0", f"--config.learner.batch_size={B}",
        f"--config.rollout.group_size={G}", "--config.eval.num_prompts=8", "--config.eval.every=0",
        "--config.env.task_size=200", "--config.data.heldout_fraction=0.2",
        "--config.rollout.max_concurrency=12", "--config.rollout.engine_slots=12",  # 3 groups in flight: batches of 8 cut groups
        "--config.checkpoint.every=1", "--config.checkpoint.keep=40", "--config.run.progress=False",
        # The hold is a worker this slow on purpose: at the cpu configs' 300 s lease timeout
        # the dispatcher quarantined it for the rest of the run, re-issued its prompts, and
        # no later checkpoint could hold groups in pieces; on a loaded machine that came
        # before any checkpoint held one (a fresh clone timed out, 2026-12-04).
        "--config.rollout.lease_timeout_s=7200",
        ]
ORPHAN_BOUND_S = 30.0


def start(workdir: str, log: str, steps: int) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": cpu_devices(1)}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "sao.main", f"--workdir={workdir}", *ARGS,
                                 f"--config.run.steps={steps}"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(pred, timeout_s: float, proc: subprocess.Popen | None = None, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the run exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout_s} s")
        time.sleep(0.05)


def children(pid: int) -> list[int]:
    """Child pids of ``pid``, from each of its threads (a thread may end while we look)."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            continue
    return out


def worker_pid(learner: int, index: int) -> int | None:
    for pid in children(learner):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if b"--role=rollout" in argv and f"--worker_index={index}".encode() in argv:
            return pid
    return None


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def latest_step(workdir: str) -> int:
    """The newest finished checkpoint's step (-1 if none); orbax's temporary directories are not steps."""
    ckpt = os.path.join(workdir, "ckpt")
    steps = [int(s) for s in os.listdir(ckpt) if s.isdigit()] if os.path.isdir(ckpt) else []
    return max((s for s in steps if checkpoint_meta(workdir, s) is not None), default=-1)


def checkpoint_meta(workdir: str, step: int) -> dict | None:
    path = os.path.join(workdir, "ckpt", str(step), "meta", "metadata")
    if not os.path.exists(os.path.join(workdir, "ckpt", str(step), "commit_success.txt")):
        return None
    with open(path) as f:
        return json.load(f)


def groups_in_pieces(meta: dict) -> tuple[int, int]:
    """(GRPO rows held by the GroupBatcher, copies of a record not yet issued) in a checkpoint."""
    data = meta["data_state"]
    held = sum(len(m) for m in (data.get("groups") or {}).get("pending", []))
    copies = len(((data["dispatcher"]["leases"].get("source") or {}).get("copies")) or [])
    return held, copies


def attack(address: str) -> list[str]:
    """The issue's attack: two UpdateWeights(version=10**6) without credentials."""
    codes = []
    with grpc.insecure_channel(address) as channel:
        stub = sao_pb2_grpc.RolloutWorkerStub(channel)
        for _ in range(2):
            try:
                r = stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=10**6, uri="/tmp/x"),
                                       timeout=30)
                codes.append(f"OK ok={r.ok} version={r.version}")
            except grpc.RpcError as e:
                codes.append(e.code().name)
    return codes


def status(address: str, security) -> sao_pb2.StatusResponse | None:
    with auth.open_channel(address, security) as channel:
        try:
            return sao_pb2_grpc.RolloutWorkerStub(channel).Status(
                sao_pb2.StatusRequest(), timeout=5, metadata=auth.call_metadata(security))
        except grpc.RpcError:
            return None


def completed(address: str, security) -> int:
    s = status(address, security)
    return 0 if s is None else s.completed


def version(address: str, security) -> int:
    s = status(address, security)
    return -1 if s is None else s.version


class HeldBack:
    """Holds the rollout worker ``pid`` at ``address`` back while the learner trains on
    the worker at ``other``: SIGSTOPped, it runs only until it has taken each weight push
    that reached ``other`` (so the learner never waits on it) and for ``WAKE_S`` every
    ``KEEPALIVE_S`` (gRPC keepalive pings; a silent worker would be dropped and its
    leases re-issued). Its leases stay in flight meanwhile."""

    KEEPALIVE_S, WAKE_S = 3.0, 0.1

    def __init__(self, pid: int, address: str, other: str, security):
        self.pid, self.address, self.other, self.security = pid, address, other, security
        self.wakes, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HeldBack":
        self.version = version(self.address, self.security)
        os.kill(self.pid, signal.SIGSTOP)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(120)
        os.kill(self.pid, signal.SIGCONT)

    def _run(self) -> None:
        woke = time.monotonic()
        while not self._stop.wait(0.1):
            target = version(self.other, self.security)
            if target <= self.version and time.monotonic() - woke < self.KEEPALIVE_S:
                continue
            os.kill(self.pid, signal.SIGCONT)
            deadline = time.monotonic() + (120 if target > self.version else self.WAKE_S)
            while time.monotonic() < deadline and not self._stop.is_set():
                self.version = max(self.version, version(self.address, self.security))
                if self.version >= target:
                    break
                time.sleep(0.05)
            if not self._stop.is_set():
                os.kill(self.pid, signal.SIGSTOP)
            self.wakes += 1
            woke = time.monotonic()


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("grpo-faults"))
    wdir = os.path.join(workdir, "workers")
    seen: dict = {"workdir": workdir}
    run = start(workdir, os.path.join(workdir, "life1.log"), LIFE1_STEPS)
    pids: list[int] = []
    try:
        wait_for(lambda: os.path.isdir(os.path.join(workdir, "publish")) and os.listdir(
            os.path.join(workdir, "publish")), 900, run, "first publish")              # RL started
        addresses = [open(os.path.join(wdir, f"worker{i}.addr")).read().strip() for i in range(2)]
        seen["attack"] = [code for a in addresses for code in attack(a)]
        seen["attack_step"] = latest_step(workdir)
        # 2. SIGKILL worker 0; it must come back on its address and serve again.
        victim = wait_for(lambda: worker_pid(run.pid, 0), 30, run, "worker 0")
        os.remove(os.path.join(wdir, "worker0.addr"))
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: os.path.exists(os.path.join(wdir, "worker0.addr")), 900, run, "a restart")
        seen["restart_s"] = time.monotonic() - t0
        seen["restarted_address"] = open(os.path.join(wdir, "worker0.addr")).read().strip()
        seen["address"] = addresses[0]
        seen["new_pid"] = worker_pid(run.pid, 0)
        security = credentials.load_security(token_file=os.path.join(workdir, "fleet.token"))
        seen["served"] = wait_for(lambda: completed(addresses[0], security), 300, run,
                                  "an episode on the restarted worker")
        # 3. Hold worker 1 back; SIGKILL the learner right after a checkpoint holding
        # groups in pieces (frozen first, so that checkpoint is the latest).
        first = latest_step(workdir) + 1
        looked: dict = {}                 # checkpoint step -> (held rows, copies): for a failure

        def latest_with_groups():
            step = latest_step(workdir)
            if step < first:
                return None
            looked[step] = groups_in_pieces(checkpoint_meta(workdir, step))
            return step if looked[step][0] else None
        held = wait_for(lambda: worker_pid(run.pid, 1), 30, run, "worker 1")
        with HeldBack(held, addresses[1], addresses[0], security) as hold:
            while True:
                try:
                    wait_for(latest_with_groups, 900, run, "a checkpoint with groups in pieces")
                except (TimeoutError, RuntimeError) as e:
                    raise type(e)(f"{e}; checkpoints since the hold, step: (held rows, "
                                  f"copies): {looked}") from None
                run.send_signal(signal.SIGSTOP)
                if latest_with_groups() is not None:
                    break
                run.send_signal(signal.SIGCONT)          # a newer one came in meanwhile
            seen["hold"] = {"steps": latest_step(workdir) - first + 1, "wakes": hold.wakes}
            pids = [worker_pid(run.pid, i) for i in range(2)]
        run.kill()
        run.wait()
        t0 = time.monotonic()
        wait_for(lambda: all(gone(p) for p in pids), ORPHAN_BOUND_S, None, "workers exiting")
        seen["orphans_gone_s"] = time.monotonic() - t0
        seen["killed_after"] = latest_step(workdir)
        seen["restored_meta"] = checkpoint_meta(workdir, seen["killed_after"])
        # 4. The same command resumes and finishes.
        seen["steps"] = seen["killed_after"] + AFTER
        life2 = start(workdir, os.path.join(workdir, "life2.log"), seen["steps"])
        seen["returncode"] = life2.wait(timeout=1200)
        seen["life2_log"] = open(os.path.join(workdir, "life2.log")).read()
        print("scenario:", json.dumps({k: v for k, v in seen.items()             # for docs/reliability.md
                                       if k not in ("restored_meta", "life2_log")}))
    finally:
        if run.poll() is None:
            run.kill()
        for p in pids:
            if p and not gone(p):
                os.kill(p, signal.SIGKILL)
    return seen


def test_unauthenticated_weight_injection_is_refused_and_the_run_goes_on(scenario):
    # Finding 1: before, both calls were ok, the workers jumped to 10**6 and the learner died.
    assert scenario["attack"] == ["UNAUTHENTICATED"] * 4
    # It kept training after the attack: the fixture waited for a checkpoint newer than any
    # at the attack and raises if the run died first (how many steps came between is the
    # run's timing, not the attack's effect; asserting 2 failed a fresh clone at 1).
    assert scenario["returncode"] == 0, scenario["life2_log"][-3000:]


def test_a_killed_worker_is_restarted_on_its_port_and_serves_again(scenario):
    # Finding 5: --role=all restarts it; the dispatcher's link reconnects to the same address.
    assert scenario["restarted_address"] == scenario["address"]
    assert scenario["new_pid"] is not None and scenario["served"] > 0


def test_workers_exit_with_a_sigkilled_learner(scenario):
    # Finding 5: before, both workers (~600 MB each) kept listening after the learner died.
    assert scenario["orphans_gone_s"] < ORPHAN_BOUND_S


def test_grpo_run_resumes_from_a_checkpoint_holding_groups(scenario):
    # Finding 4: the rows the learner held for incomplete groups are in the checkpoint
    # (tests/reliability/test_grpo_checkpoint.py checks exactly-once training in detail).
    held, _ = groups_in_pieces(scenario["restored_meta"])
    assert held > 0
    k = scenario["killed_after"]
    assert f"resumed at step {k}" in scenario["life2_log"]
    summary = json.load(open(os.path.join(scenario["workdir"], "summary.json")))
    assert summary["steps"] == scenario["steps"] == k + AFTER
    rl = [r for r in run_metrics.read_metrics(scenario["workdir"]) if r["phase"] == "rl"]
    after = [r for r in rl if r["step"] > k]
    assert [r["step"] for r in after][-AFTER:] == list(range(k + 1, k + AFTER + 1))
    # No group lost to the resume: none evicted as incomplete, and every row the batcher got
    # since the start is served, held or dropped with a stale group (re-sampled then).
    assert all(r["groups/dropped_evicted"] == 0 for r in after)
    for r in after:
        assert r["groups/rows_in"] == (r["groups/rows_served"] + r["groups/dropped_rows"]
                                       + r["groups/late_rows"] + r["groups/held_rows"])
        assert r["groups/dropped"] == r["groups/resampled"] + r["groups/abandoned"]
