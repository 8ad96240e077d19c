"""Hostile-client probe: another process on the network calls a live worker
while a learner trains on it (no token, wrong token, unknown methods, and with
the token: absurd versions, 2**62, uris outside the publish root). The worker
refuses each with an error, its engine never moves, and the learner keeps
training and publishing; none of these calls ends the run."""
import grpc
import numpy as np
import pytest

from sao import ckpt
from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig
from sao.rpc import auth, credentials, sao_pb2, sao_pb2_grpc

VOCAB = 272
METHODS = ("Generate", "UpdateWeights", "Status", "NoSuchMethod", "../UpdateWeights", "")


def _sim():
    engine = sim.SimulatedEngine(seconds_per_token=1e-4)
    return engine, sim.make_sim_episode_fn(engine)


def _raw_calls(channel, metadata):
    """Every method the service has and a few it has not, with raw bytes."""
    for m in METHODS:
        call = channel.unary_unary(f"/sao.rpc.RolloutWorker/{m}", request_serializer=bytes,
                                   response_deserializer=bytes)
        yield m, lambda call=call: call(b"", metadata=metadata, timeout=10)
    req = sao_pb2.UpdateWeightsRequest(version=10**6, uri="/x").SerializeToString()
    update = channel.unary_unary("/sao.rpc.RolloutWorker/UpdateWeights",
                                 request_serializer=bytes, response_deserializer=bytes)
    yield "UpdateWeights(10**6)", lambda: update(req, metadata=metadata, timeout=10)


@pytest.fixture
def run(tmp_path):
    """A worker and a learner-side dispatcher as a run sets them up."""
    publish_root = tmp_path / "publish"
    security = credentials.load_security(token_file=credentials.ensure_token_file(str(tmp_path)))
    worker = ThreadedWorker(_sim, WorkerConfig(max_concurrency=8, security=security,
                                               publish_root=str(publish_root)))
    cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, security=security)
    prompts = [{"prompt_id": f"p{i}", "length": 8} for i in range(16)]
    with worker, Dispatcher([worker.address], prompts, cfg) as d:
        yield worker, d, security, publish_root


def _train_step(d, publish_root):
    assert len(d.get_batch(timeout=30)) == 4
    v = d.learner_version + 1
    uri = ckpt.publish(str(publish_root), v, {"w": np.zeros(2, np.float32)})  # as the learner does
    assert d.push_weights(v, uri) == {list(d.snapshot()["workers"])[0]: v}


def test_hostile_clients_cannot_stop_or_steer_a_run(run):
    worker, d, security, publish_root = run
    _train_step(d, publish_root)
    codes = {}
    with grpc.insecure_channel(worker.address) as ch:
        for md_name, md in [("none", ()), ("wrong", (("authorization", "Bearer guess"),)),
                            ("no prefix", (("authorization", security.token),))]:
            for name, call in _raw_calls(ch, md):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                codes[md_name, name] = e.value.code()
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, codes
    assert worker.engine.version == 1

    # A caller holding the token (a second learner, a stale script) still cannot
    # move the worker to a version the learner never published, or load from
    # outside the run's publish root.
    md = auth.call_metadata(security)
    with grpc.insecure_channel(worker.address) as ch:
        stub = sao_pb2_grpc.RolloutWorkerStub(ch)
        inside = str(publish_root / "v" / "params")
        for version, uri, why in [(10**6, inside, "max_version_jump"), (2**62, inside, "outside"),
                                  (-1, inside, "outside"), (0, inside, "older"),
                                  (1, inside, "already served"),
                                  (2, "/etc/passwd", "publish root"),
                                  (2, str(publish_root / ".." / "x"), "publish root"),
                                  (2, "https://example.org/w", "publish root")]:
            r = stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=version, uri=uri),
                                   metadata=md, timeout=10)
            assert not r.ok and r.version == 1 and why in r.error, (version, uri, r.error)
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/sao.rpc.RolloutWorker/NoSuchMethod", request_serializer=bytes,
                           response_deserializer=bytes)(b"", metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert worker.engine.version == 1 and worker.server.servicer.refused_updates == 8

    for _ in range(3):  # the learner trains on: every push lands, nothing is dropped
        _train_step(d, publish_root)
    m = d.snapshot()
    assert m["learner_version"] == 4 and worker.engine.version == 4
    assert m["drops"] == {} and m["workers"][worker.address]["problem"] == ""
