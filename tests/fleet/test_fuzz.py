"""Fuzz: many trajectories, valid, corrupted and raw garbage, through the
dispatcher's receive path; every one gets exactly one outcome and the learner
keeps training with finite parameters."""
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.rpc import codec

from . import tiny_learner
from .helpers import VOCAB, good_trajectory, prompts
from .test_faults import FakeLink

B = 4
CORRUPTIONS = {
    "ok": lambda t: None,
    "oov": lambda t: t.tokens.__setitem__(-1, VOCAB + 5),
    "negative_id": lambda t: t.tokens.__setitem__(0, -3),
    "nan": lambda t: t.rollout_logprobs.__setitem__(-1, np.nan),
    "inf": lambda t: t.rollout_logprobs.__setitem__(-1, -np.inf),
    "positive": lambda t: t.rollout_logprobs.__setitem__(-1, 3.0),
    "huge_negative": lambda t: t.rollout_logprobs.__setitem__(-1, -1e30),
    "no_action": lambda t: t.action_mask.__setitem__(slice(None), False),
    "future": lambda t: t.policy_version.__setitem__(-1, 99),
    "short_mask": lambda t: setattr(t, "action_mask", t.action_mask[:-2]),
    "nan_reward": lambda t: setattr(t, "reward", np.nan),
    "big_reward": lambda t: setattr(t, "reward", 1e6),
}

payload = st.one_of(
    st.tuples(st.sampled_from(sorted(CORRUPTIONS)), st.integers(1, 30), st.integers(1, 30),
              st.floats(-1, 1)),
    st.binary(max_size=200),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=st.lists(payload, min_size=1, max_size=40))
def test_fuzzed_stream_keeps_learner_finite(payloads):
    n = len(payloads)
    d = Dispatcher([], prompts(n), DispatcherConfig(batch_size=B, vocab_size=VOCAB, tau=3))
    link = FakeLink("fuzz")
    d.link_joined(link, 1000, None)
    params = tiny_learner.init(VOCAB)
    served = 0
    for p in payloads:
        lease = link.leases.popleft()
        if isinstance(p, bytes):
            link.answer(d, lease, data=p)
        else:
            kind, n_prompt, n_action, reward = p
            t = good_trajectory(lease.prompt_id, n_prompt, n_action, reward=reward)
            CORRUPTIONS[kind](t)
            try:
                data = codec.encode(t)
            except ValueError:  # a sender cannot even encode it
                data = b"\x00" + codec.encode(good_trajectory("x"))[1:]
            link.answer(d, lease, data=data)
        if d.snapshot()["queue_depth"] >= B or not link.leases:
            while batch := d.get_batch(timeout=5):
                served += len(batch)
                params = tiny_learner.update(params, batch, batch_size=B)
                assert np.all(np.isfinite(np.asarray(params)))
                if d.snapshot()["queue_depth"] < B and link.leases:
                    break
    m = d.snapshot()
    assert m["trained"] == served and served + m["dropped"] == n
    assert m["prompts_in_flight"] == 0 and not link.leases
