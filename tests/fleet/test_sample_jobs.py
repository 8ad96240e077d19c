"""Sampling jobs (held-out evaluation through the fleet) and broken workers.

A job's leases carry its temperature to the worker's episode function, its
answers come back in prompt order and are never trained on (counted apart);
a worker whose weight loads keep failing, or that reports its engine
unusable, ends the run with a ``FleetError`` naming it instead of being
retried until the batch timeout.
"""
import re
import time

import pytest

from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig, FleetError
from sao.fleet.local import ThreadedWorker
from sao.fleet.sample_jobs import SampleJob
from sao.fleet.worker import WorkerConfig

from .helpers import VOCAB, prompts


def temperature_worker(engine_cls=sim.SimulatedEngine, **config) -> ThreadedWorker:
    """A simulated worker whose trajectories record the lease's temperature."""
    def make():
        engine = engine_cls(seconds_per_token=1e-4, chunk_tokens=8)
        inner = sim.make_sim_episode_fn(engine)

        async def episode(prompt, temperature=None):
            traj = await inner(prompt)
            traj.metadata["temperature"] = temperature
            return traj
        return engine, episode
    return ThreadedWorker(make, WorkerConfig(max_concurrency=4, **config))


def test_sample_job_leases_carry_temperature_and_are_never_trained():
    train = prompts(40, length=8, prefix="t")
    held_out = [{"prompt_id": f"e{i}", "length": 6, "reward": float(i % 3 == 0)}
                for i in range(10)]
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=1, reconnect_s=0.05)
    with temperature_worker() as a, temperature_worker() as b:
        d = Dispatcher([a.address, b.address], train, cfg)
        d.push_weights(3, "v3")   # before start: each worker syncs to v3 before its first lease
        with d:
            first = d.get_batch(timeout=30)
            sampled = d.sample(held_out, temperature=0.25, timeout=30)
            trained = first
            while batch := d.get_batch(timeout=30):
                trained += batch
            snap = d.snapshot()
    assert [t.prompt_id for t in sampled] == [p["prompt_id"] for p in held_out]
    assert all(t.metadata["temperature"] == 0.25 for t in sampled)
    assert [t.reward for t in sampled] == [p["reward"] for p in held_out]
    assert all(set(t.policy_version) == {3} for t in sampled)
    assert all(t.metadata["temperature"] is None for t in trained)
    assert all(set(t.policy_version) == {3} for t in trained)
    assert sorted(t.prompt_id for t in trained) == sorted(p["prompt_id"] for p in train)
    assert snap["sampled"] == 10 and snap["trained"] == 40
    assert snap["sample_dropped"] == snap["sample_failed"] == 0 and snap["dropped"] == 0


def test_k_samples_of_each_prompt_are_k_issues_answered_in_order():
    # What eval.samples_per_prompt = k sends (sao/train.py): each held-out prompt k times with
    # group 0..k-1. Before, a fleet evaluation with k > 1 raised "distinct prompt ids" at step 0.
    held_out = [{"prompt_id": f"e{i}", "length": 6, "reward": float(i % 2)} for i in range(3)]
    copies = [{**p, "group": j} for p in held_out for j in range(4)]
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=1, reconnect_s=0.05)
    with temperature_worker() as a, temperature_worker() as b:
        with Dispatcher([a.address, b.address], prompts(8, length=8, prefix="t"), cfg) as d:
            d.push_weights(1, "v1")
            sampled = d.sample(copies, temperature=1.0, timeout=30)
            snap = d.snapshot()
    assert [t.prompt_id for t in sampled] == [p["prompt_id"] for p in copies]
    assert [t.reward for t in sampled] == [p["reward"] for p in copies]
    assert [t.group for t in sampled] == [p["group"] for p in copies]
    assert snap["sampled"] == 12 and snap["sample_dropped"] == snap["sample_failed"] == 0


def test_sample_job_refuses_bad_requests():
    with pytest.raises(ValueError, match="at least one"):
        SampleJob([], temperature=1.0, max_attempts=1)
    with pytest.raises(ValueError, match="distinct"):
        SampleJob([{"id": 1}, {"id": 1}], temperature=1.0, max_attempts=1)
    with pytest.raises(ValueError, match="distinct"):
        SampleJob([{"id": 1, "group": 0}, {"id": 1, "group": 0}], temperature=1.0, max_attempts=1)
    with pytest.raises(ValueError, match="temperature"):
        SampleJob([{"id": 1}], temperature=-1.0, max_attempts=1)


class RefusingEngine(sim.SimulatedEngine):
    """Every weight load fails (a server that cannot read the export)."""

    async def load_weights(self, version, uri):
        raise OSError(f"cannot read {uri}")


class GivingUpEngine(RefusingEngine):
    """Fails loads and, after two, says it gave up (like SGLangEngine)."""

    failures = 0
    unusable = None

    async def load_weights(self, version, uri):
        self.failures += 1
        if self.failures >= 2:
            self.unusable = f"{self.failures} weight loads failed in a row"
        await super().load_weights(version, uri)


@pytest.mark.parametrize("engine_cls, reason", [
    (RefusingEngine, r"3 weight loads failed in a row, the last: OSError: cannot read v\d+"),
    (GivingUpEngine, r"unusable: 2 weight loads failed in a row")])
def test_a_worker_that_keeps_failing_loads_ends_the_run_naming_it(engine_cls, reason):
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=1, reconnect_s=0.2,
                           max_weight_failures=3)
    with temperature_worker() as good, temperature_worker(engine_cls) as bad:
        with Dispatcher([good.address, bad.address], prompts(400, length=8), cfg) as d:
            d.get_batch(timeout=30)
            d.push_weights(1, "v1")
            t0 = time.monotonic()
            with pytest.raises(FleetError) as err:
                while time.monotonic() - t0 < 60:  # bounded, also where it never raises
                    d.get_batch(timeout=30)
                    d.push_weights(d.learner_version + 1, f"v{d.learner_version + 1}")
            elapsed = time.monotonic() - t0
            snap = d.snapshot()
    assert bad.address in str(err.value) and re.search(reason, str(err.value))
    assert good.address not in str(err.value)
    assert elapsed < 10  # a few reconnects, not the batch timeout
    assert "broken" in snap["workers"][bad.address]["problem"]
    # The good worker kept serving until the error.
    assert snap["workers"][good.address]["problem"] == ""


def test_broken_workers_within_the_tolerance_leave_the_run_going():
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, tau=1, reconnect_s=0.05,
                           max_weight_failures=1, max_broken_workers=1)
    with temperature_worker() as good, temperature_worker(RefusingEngine) as bad:
        with Dispatcher([good.address, bad.address], prompts(40, length=8), cfg) as d:
            d.push_weights(1, "v1")
            trained = []
            while batch := d.get_batch(timeout=30):
                trained += batch
            snap = d.snapshot()
    assert len(trained) == 40 and snap["workers"][bad.address]["trajectories"] == 0
    assert snap["workers"][bad.address]["problem"].startswith("broken")
