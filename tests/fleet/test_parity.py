"""The log-prob parity gate's parts: the gap kernel, the verdict on a server's
answer, the probe set, the learner's reference, and the worker's Score rpc.

The gate at work in the dispatcher (real workers quarantined, a run stopped)
is test_parity_gate.py.
"""
import math

import jax
import numpy as np
import pytest
from flax import nnx

from sao.fleet import parity
from sao.fleet.local import ThreadedWorker
from sao.fleet.parity import LIKELY_CAUSES, ParityGate, token_gaps
from sao.fleet.probe import PROBE_EXCHANGES, probe_sequences
from sao.fleet.sim import SimulatedEngine, make_sim_episode_fn
from sao.fleet.worker import WorkerConfig
from sao.models import Transformer, get_preset, token_logprobs
from sao.models.tokenizer import ByteTokenizer
from sao.rollout.jax_engine import JaxEngine
from sao.rpc import auth, codec, sao_pb2, sao_pb2_grpc

SEQS = [[1, 2, 3, 4], [5, 6, 7]]
REF = [np.array([0.0, -1.0, -2.0, -0.5], np.float32), np.array([0.0, -3.0, -0.25], np.float32)]


def answer(logprobs, version=3, ok=True, error=""):
    return sao_pb2.ScoreResponse(ok=ok, version=version, error=error, logprobs=[
        codec.encode_array(np.asarray(lp, np.float32), np.dtype("<f4")) for lp in logprobs])


def test_token_gaps_against_a_loop():
    rng = np.random.default_rng(0)
    ref = [rng.normal(size=n) for n in (2, 5, 9)]
    got = [r + rng.normal(scale=0.1, size=r.shape) for r in ref]
    want = []
    for r, g in zip(ref, got):
        for t in range(1, len(r)):  # entry 0 is not a log-prob
            want.append(abs(g[t] - r[t]))
    np.testing.assert_allclose(token_gaps(ref, got), want)
    with pytest.raises(ValueError, match="scored sequences"):
        token_gaps(ref, got[:2])
    with pytest.raises(ValueError, match="shape"):
        token_gaps(ref, [got[0], got[1][:3], got[2]])


def test_verdicts():
    gate = ParityGate(SEQS, max_mean_gap=0.1, max_token_gap=0.5)
    gate.set_reference(3, REF)
    same = gate.judge("a:1", answer([r + 0.01 for r in REF]))
    assert same.passed and same.mean_gap == pytest.approx(0.01, abs=1e-6) and not same.error
    off = gate.judge("b:1", answer([r - 0.2 for r in REF]))  # mean 0.2 > 0.1
    assert not off.passed and off.mean_gap == pytest.approx(0.2, abs=1e-6)
    reason = off.reason(gate.max_mean_gap)
    assert "version 3" in reason and "0.2" in reason and LIKELY_CAUSES in reason
    for cause in ("tokenizer or chat template", "dtype", "rope", "half loaded"):
        assert cause in reason
    spike = [REF[0] + np.array([0, 0, 0.9, 0], np.float32), REF[1]]  # mean 0.18 / 5 tokens
    spiky = gate.judge("c:1", answer(spike))
    assert not spiky.passed and spiky.max_gap == pytest.approx(0.9, abs=1e-6)
    for bad in ([r[:-1] for r in REF], [REF[0]], [np.full_like(r, np.nan) for r in REF],
                [r + 0.5 for r in REF]):     # shapes, count, NaN, positive log-probs
        r = gate.judge("d:1", answer(bad))
        assert not r.passed and r.error.startswith("unusable answer") and math.isnan(r.mean_gap)
    refused = gate.judge("e:1", answer([], ok=False, error="NotImplementedError: cannot score"))
    assert not refused.passed and "cannot check" in refused.reason(0.1)
    assert LIKELY_CAUSES not in refused.reason(0.1)  # its error says why
    assert gate.judge("f:1", answer(REF, version=4)) is None  # no reference for version 4
    snap = gate.snapshot()
    assert snap["checks"] == 8 and snap["failures"] == 7 and snap["unchecked"] == 1
    assert snap["a:1/passed"] == 1 and snap["b:1/passed"] == 0 and snap["a:1/version"] == 3
    assert snap["b:1/mean_gap"] == pytest.approx(0.2, abs=1e-6)


def test_reference_checks_and_bounds():
    gate = ParityGate(SEQS)
    with pytest.raises(ValueError, match="shapes"):
        gate.set_reference(0, [REF[0]])
    with pytest.raises(ValueError, match="finite"):
        gate.set_reference(0, [REF[0], np.array([0, np.inf, 0], np.float32)])
    for v in range(20):
        gate.set_reference(v, REF)
    assert not gate.has_reference(0) and gate.has_reference(19)   # the newest few are kept
    for bad in (dict(max_mean_gap=0), dict(max_token_gap=-1.0), dict(timeout_s=0)):
        with pytest.raises(ValueError):
            ParityGate(SEQS, **bad)
    with pytest.raises(ValueError, match=">= 2 tokens"):
        ParityGate([[1]])


class FakeLink:
    """What ``parity.verify`` uses of a ``WorkerLink``: its address and ``score``."""

    def __init__(self, response):
        self.address, self.response, self.calls = "w:1", response, 0

    def score(self, request, timeout_s):
        self.calls += 1
        return self.response


def test_verify_quarantines_a_failure_and_retries_no_answer():
    gate = ParityGate(SEQS)
    gate.set_reference(3, REF)
    quarantined = []

    def quarantine(address, reason):
        quarantined.append((address, reason))
        return True

    assert parity.verify(gate, FakeLink(answer(REF)), 3, quarantine) is True
    link = FakeLink(answer([r - 1 for r in REF]))
    assert parity.verify(gate, link, 3, quarantine) is False
    assert quarantined[0][0] == "w:1" and "log-prob parity" in quarantined[0][1]
    gone = FakeLink(answer([], ok=False, version=-1, error="UNAVAILABLE: connection refused"))
    assert parity.verify(gate, gone, 3, quarantine) is None and len(quarantined) == 1
    slow = FakeLink(answer([], ok=False, version=-1, error="DEADLINE_EXCEEDED: late"))
    assert parity.verify(gate, slow, 3, quarantine) is False and len(quarantined) == 2
    unknown = FakeLink(answer(REF))
    assert parity.verify(gate, unknown, 7, quarantine) is True and unknown.calls == 0
    assert gate.snapshot()["unchecked"] == 1


def test_probe_set_is_fixed_and_fits():
    tok = ByteTokenizer()
    seqs = probe_sequences(tok, tool_format="tags", max_len=64)
    assert seqs == probe_sequences(ByteTokenizer(), tool_format="tags", max_len=64)
    assert len(seqs) == len(PROBE_EXCHANGES) and all(2 <= len(s) <= 64 for s in seqs)
    full = probe_sequences(tok, tool_format="tags", max_len=4096)
    assert full[0][0] == tok.bos_id and full[0][-1] == tok.eos_id
    text = tok.decode(full[0])
    assert "<python>print(17 * 23)</python>" in text and "<answer>391</answer>" in text
    with pytest.raises(ValueError):
        probe_sequences(tok, tool_format="tags", max_len=1)


def test_probe_set_in_chatml():
    tok = ByteTokenizer()  # ChatML renders as text first: any tokenizer shows the framing
    [first, *_] = probe_sequences(tok, tool_format="hermes", max_len=4096)
    text = tok.decode(first)
    assert text.startswith("<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n")
    assert '<tool_call>\n{"name": "python", "arguments": {"code": "print(17 * 23)"}}' in text
    assert "<tool_response>\n391\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\nThe answer is 391.<|im_end|>\n")


def test_every_sglang_fleet_config_is_gated():
    """The gate is on for SGLang fleets as for JaxEngine workers (it was off by
    default while SGLang's report of the last vocabulary id as 0 failed every
    server); ``rollout.parity.enabled=False`` is the one switch."""
    from experiments import sao_math
    from sao import components
    tok = ByteTokenizer()
    for variant in ("fleet_cpu", "qwen3_8b"):
        cfg = sao_math.get_config(variant)
        assert cfg.rollout.engine == "sglang" and "sglang" not in cfg.rollout.parity
        gate = components.parity_gate(cfg, tok)
        assert isinstance(gate, ParityGate) and gate.max_mean_gap == cfg.rollout.parity.max_mean_gap
        cfg.rollout.parity.enabled = False
        assert components.parity_gate(cfg, tok) is None


def score_rpc(address, seqs):
    with auth.open_channel(address, auth.Security()) as channel:
        stub = sao_pb2_grpc.RolloutWorkerStub(channel)
        return stub.Score(sao_pb2.ScoreRequest(sequences=[
            codec.encode_array(np.asarray(s, np.int32), np.dtype("<i4")) for s in seqs]),
            timeout=60)


def test_score_rpc_of_a_jax_worker_and_its_refusals():
    model = Transformer(get_preset("tiny", hidden_size=64, num_layers=1, num_heads=2,
                                   num_kv_heads=1, intermediate_size=128), rngs=nnx.Rngs(0))
    seqs = [[257, 10, 11, 12], [257, 30, 31]]
    graphdef, params = nnx.split(model)
    padded = np.zeros((2, 16), np.int32)
    for i, s in enumerate(seqs):
        padded[i, :len(s)] = s
    out = jax.jit(lambda p, t: token_logprobs(nnx.merge(graphdef, p), t))(params, padded)
    want = [np.asarray(out)[i, :len(s)] for i, s in enumerate(seqs)]

    def make():
        engine = JaxEngine(model, max_slots=2, max_len=64, version=5)
        return engine, None
    with ThreadedWorker(make, WorkerConfig()) as w:
        r = score_rpc(w.address, seqs)
        assert r.ok and r.version == 5
        got = [codec.decode_array(a, np.dtype("<f4")) for a in r.logprobs]
        for g, w_ in zip(got, want):
            np.testing.assert_allclose(g, w_, atol=2e-5)
        too_many = score_rpc(w.address, [[1, 2]] * 65)
        assert not too_many.ok and "sequences" in too_many.error
        bad_id = score_rpc(w.address, [[1, 999]])
        assert not bad_id.ok and "vocab_size" in bad_id.error

    def make_sim():
        engine = SimulatedEngine(seconds_per_token=1e-4)
        return engine, make_sim_episode_fn(engine)
    with ThreadedWorker(make_sim, WorkerConfig()) as w:
        r = score_rpc(w.address, seqs)
        assert not r.ok and r.error.startswith("NotImplementedError")
