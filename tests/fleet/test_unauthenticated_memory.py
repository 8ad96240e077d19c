"""S3: a caller without the token cannot make a worker buffer a large message.

The worker takes requests of at most ``sao.rpc.auth.MAX_REQUEST_BYTES``
(leases, weight-load orders and status: weights travel by location, never as
bytes), so gRPC refuses a larger message from its length prefix before
reading it, whoever sends it. Measured on a worker process
(``python -m sao.fleet.sim_worker``) through /proc: its peak resident memory
(``VmHWM``) over 200 MiB unauthenticated ``UpdateWeights`` calls, one and then four at
once (at commit 04f7491 the peak grew by about 1.1 GiB)."""
import concurrent.futures

import grpc
import pytest

from sao.rpc import sao_pb2

from .helpers import SubprocessWorker

MIB = 1 << 20


def _mem_mib(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (peak) of a process, MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


@pytest.fixture(scope="module")
def worker():
    w = SubprocessWorker(token="the-run-token")
    yield w
    w.stop()


def _update(channel, payload: bytes, metadata=()):
    call = channel.unary_unary("/sao.rpc.RolloutWorker/UpdateWeights",
                               request_serializer=bytes, response_deserializer=bytes)
    try:
        call(payload, metadata=metadata, timeout=60)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_unauthenticated_200_mib_call_is_refused_without_buffering(worker):
    opts = [("grpc.max_send_message_length", 512 * MIB)]
    big = sao_pb2.UpdateWeightsRequest(version=7, uri="x" * (200 * MIB)).SerializeToString()
    with grpc.insecure_channel(worker.address, options=opts) as ch:
        assert _update(ch, b"") == grpc.StatusCode.UNAUTHENTICATED  # warm: the call path exists
        before = _mem_mib(worker.proc.pid)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # one, then four at once
            codes = {_update(ch, big)} | set(pool.map(lambda _: _update(ch, big), range(4)))
        after = _mem_mib(worker.proc.pid)
        # ... and with the token the same message is refused as too large
        big_with_token = _update(ch, big, (("authorization", "Bearer the-run-token"),))
    grew = {k: after[k] - before[k] for k in after}
    print(f"worker memory before {before} after {after} MiB")
    assert codes <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert big_with_token == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grew["VmHWM"] <= 8 and grew["VmRSS"] <= 8, (before, after)
    assert worker.proc.poll() is None  # still serving
