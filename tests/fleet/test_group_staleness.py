"""GRPO groups are units under the staleness bound (issue 22, "fair arms").

The pieces as ``sao.train.reinforce`` wires them: a ``PromptStream`` with
``group_size`` copies per record and the records to re-sample, the
``Dispatcher`` over simulated workers on real gRPC (one fast, one 20x slower:
members of one group straggle; the first attempt-0 member either worker
receives is held until version TAU + 2 is published, so at least one group
goes stale and is re-sampled whatever the speeds), the ``GroupBatcher`` with the dispatcher's
version, ``tau`` and the stream's ``resample``, and ``sao.rl_loop.train``.
Only the learner is a fake (every update is one new policy version).
"""
import asyncio
import json
import threading
import types

import numpy as np
import pytest

from sao import rl_loop
from sao.data.prompts import PromptStream, prompt_iterator
from sao.envs.base import make_prompt
from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig

G, B, TAU, STEPS = 4, 8, 1, 14
VOCAB = 272


class CountingLearner:
    cfg = types.SimpleNamespace(length_buckets=(96,), batch_size=B, pad_id=0)

    def update(self, states, batch, seq_advantages=None):
        return types.SimpleNamespace(policy_version=states.policy_version + 1), {}


def records(n=30):
    lengths = np.clip(np.rint(6 * np.exp(1.0 * np.random.default_rng(0).standard_normal(n))), 2, 60)
    return [{**make_prompt(f"q{i}", "t", f"question {i}", {"answer": str(i)}),
             "length": int(lengths[i])} for i in range(n)]


HELD = {"key": None, "lock": threading.Lock(), "release": threading.Event()}


def worker(seconds_per_token):
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=seconds_per_token, chunk_tokens=2)
        inner = sim.make_sim_episode_fn(engine)

        async def episode(prompt):   # one member held: its group goes stale, not by chance
            key = (prompt["prompt_id"], prompt["epoch"], prompt["group"])
            with HELD["lock"]:
                if HELD["key"] is None and prompt["group"] == 0:
                    HELD["key"] = key
            while key == HELD["key"] and not HELD["release"].is_set():
                await asyncio.sleep(0.01)
            return await inner(prompt)
        return engine, episode
    return ThreadedWorker(make, WorkerConfig(max_concurrency=6))


def run_loop(addresses, tau):
    HELD["key"] = None
    HELD["release"].clear()
    recs = records()
    stream = PromptStream(prompt_iterator(recs, seed=0), group_size=G, records=recs)
    d = Dispatcher(addresses, stream, DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=tau))
    groups = rl_loop.GroupBatcher(d.get_batch, group_size=G, batch_size=B,
                                  version=lambda: d.learner_version, tau=tau,
                                  resample=stream.resample)
    written, served = {}, []

    def write(step, m):
        written.setdefault(step, {}).update(m)

    def record(trajs):
        served.extend((t.prompt_id, t.epoch, t.group) for t in trajs)
        return {}

    def publish(step, version):
        if version >= TAU + 2:
            HELD["release"].set()
        return f"mem://{version}"

    hooks = rl_loop.LoopHooks(publish=publish, write=write, next_batch=groups,
                              batch_metrics=record)
    with d:
        d.push_weights(0, "mem://0")
        _, done, _ = rl_loop.train(CountingLearner(), types.SimpleNamespace(policy_version=0), d,
                                   start_step=0, hooks=hooks,
                                   loop=rl_loop.LoopConfig(steps=STEPS, batch_timeout_s=60))
        snap = d.snapshot()
        state = json.loads(json.dumps({"groups": groups.state_dict(), "stream": stream.get_state()}))
    return done, written, served, groups, snap, state


@pytest.fixture(scope="module")
def fleet():
    ws = [worker(1e-3), worker(2e-2)]
    try:
        yield [w.address for w in ws]
    finally:
        HELD["release"].set()
        for w in ws:
            w.stop()


def test_at_tau_1_no_grpo_token_trains_beyond_lag_1_and_drops_add_up(fleet):
    done, written, served, groups, snap, state = run_loop(fleet, TAU)
    assert done == STEPS
    for step in range(1, STEPS + 1):               # lag histogram of each trained batch's tokens
        counts = written[step]["batch/staleness_counts"]
        assert len(counts) <= TAU + 1 and sum(counts) > 0, (step, counts)
    c = groups.counts
    assert c["dropped_stale"] > 0, "the stragglers never cost a group: the test shows nothing"
    # Every row the batcher received has one outcome, every dropped group one fate.
    assert c["rows_in"] == c["rows_served"] + c["dropped_rows"] + c["late_rows"] + groups.held_rows()
    assert c["rows_served"] == len(served) == STEPS * B
    assert c["dropped_groups"] == c["dropped_stale"] + c["dropped_evicted"]
    assert c["dropped_groups"] == c["resampled"] + c["abandoned"]
    # Accepted rows reached the batcher, wait in the buffer, or went stale there.
    assert snap["accepted"] == c["rows_in"] + snap["queue_depth"] + snap["stale_buffered"]
    # Whole groups only, and re-sampled groups (attempt >= 1) were trained.
    by_group = {}
    for p, e, g in served:
        by_group.setdefault((p, e, g // G), set()).add(g % G)
    assert all(m == set(range(G)) for m in by_group.values())
    assert any(a >= 1 for _, _, a in by_group)
    # The state round-trips the counts and the held rows.
    again = rl_loop.GroupBatcher(lambda t: [], group_size=G, batch_size=B, version=lambda: 0, tau=TAU)
    again.load_state_dict(state["groups"])
    assert again.counts == c and again.held_rows() == groups.held_rows()
    assert again.metrics() == groups.metrics()
