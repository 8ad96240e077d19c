"""Token in metadata (constant-time check) and TLS from configured paths."""
import datetime
import ipaddress

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sao.rpc import auth, sao_pb2, sao_pb2_grpc

from sao.fleet import sim
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig

VOCAB = 272


def sim_worker(security):
    def make():
        engine = sim.SimulatedEngine(seconds_per_token=1e-4)
        return engine, sim.make_sim_episode_fn(engine)
    return ThreadedWorker(make, WorkerConfig(max_concurrency=16, security=security))


def prompts(n):
    return [{"prompt_id": f"p{i}", "length": 8} for i in range(n)]

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def worker():
    w = sim_worker(security=auth.Security(token=TOKEN))
    yield w
    w.stop()


def _calls(stub, metadata):
    yield lambda: stub.Status(sao_pb2.StatusRequest(), metadata=metadata, timeout=10)
    yield lambda: stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=1, uri="u"),
                                     metadata=metadata, timeout=10)
    yield lambda: list(stub.Generate(iter([sao_pb2.GenerateRequest()]), metadata=metadata,
                                     timeout=10))


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),),
                                      (("authorization", TOKEN),),
                                      (("authorization", "Bearer " + TOKEN[:-1]),)])
def test_missing_or_wrong_token_is_unauthenticated(worker, metadata):
    with grpc.insecure_channel(worker.address) as ch:
        stub = sao_pb2_grpc.RolloutWorkerStub(ch)
        for call in _calls(stub, metadata):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert worker.engine.version == 0  # the rejected UpdateWeights did nothing


def test_unknown_method_without_token_is_unauthenticated(worker):
    # Without the token a caller cannot tell unknown methods from real ones.
    with grpc.insecure_channel(worker.address) as ch:
        probe = ch.unary_unary("/sao.rpc.RolloutWorker/NoSuchMethod",
                               request_serializer=lambda x: x, response_deserializer=lambda x: x)
        with pytest.raises(grpc.RpcError) as e:
            probe(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        md = auth.call_metadata(auth.Security(token=TOKEN))
        with pytest.raises(grpc.RpcError) as e:
            probe(b"", metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_right_token_is_served(worker):
    md = auth.call_metadata(auth.Security(token=TOKEN))
    with grpc.insecure_channel(worker.address) as ch:
        stub = sao_pb2_grpc.RolloutWorkerStub(ch)
        status = stub.Status(sao_pb2.StatusRequest(), metadata=md, timeout=10)
        assert status.healthy and status.max_concurrency == 16


def test_token_ok_is_constant_time_compare(monkeypatch):
    seen = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    assert auth.token_ok([("authorization", "Bearer abc")], "abc")
    assert not auth.token_ok([], "abc")
    assert seen == [(b"abc", b"abc"), (b"", b"abc")]


def test_worker_binds_loopback_by_default(worker):
    assert worker.address.startswith("127.0.0.1:")


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_with_token_end_to_end(tmp_path):
    from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
    cert, key = _self_signed(tmp_path)
    server_sec = auth.Security(token=TOKEN, tls_cert=cert, tls_key=key)
    with sim_worker(security=server_sec) as w:
        # A plaintext client cannot talk to the TLS port.
        with grpc.insecure_channel(w.address) as ch:
            with pytest.raises(grpc.RpcError):
                sao_pb2_grpc.RolloutWorkerStub(ch).Status(sao_pb2.StatusRequest(), timeout=3)
        client_sec = auth.Security(token=TOKEN, tls_ca=cert)
        cfg = DispatcherConfig(batch_size=4, vocab_size=VOCAB, security=client_sec)
        with Dispatcher([w.address], prompts(8), cfg) as d:
            assert len(d.get_batch(timeout=30)) == 4
            assert d.push_weights(1, "file:///ckpt/1") == {w.address: 1}
            assert len(d.get_batch(timeout=30)) == 4


def test_security_needs_cert_and_key_together():
    with pytest.raises(ValueError, match="together"):
        auth.Security(tls_cert="c.pem")
