"""The worker service directly over gRPC, and the staleness arithmetic."""
import grpc
import pytest

from sao.fleet import staleness
from sao.rpc import codec, sao_pb2, sao_pb2_grpc

from .helpers import good_trajectory, sim_worker


def lease(i, length=8):
    return sao_pb2.Lease(lease_id=f"L{i}", prompt_id=f"p{i}",
                         prompt_json=f'{{"length": {length}}}')


def test_generate_streams_in_completion_order_then_ends_on_half_close():
    with sim_worker(seconds_per_token=2e-3) as w, grpc.insecure_channel(w.address) as ch:
        stub = sao_pb2_grpc.RolloutWorkerStub(ch)
        req = sao_pb2.GenerateRequest(leases=[lease(0, 200), lease(1, 8), lease(2, 40)])
        responses = list(stub.Generate(iter([req]), timeout=30))
        status = stub.Status(sao_pb2.StatusRequest(), timeout=10)
    finished = [f for r in responses for f in r.finished]
    assert [f.lease_id for f in finished] == ["L1", "L2", "L0"]
    trajs = [codec.decode(f.trajectory) for f in finished]
    assert [(t.prompt_id, t.trajectory_id, t.num_action_tokens) for t in trajs] == \
        [("p1", "L1", 8), ("p2", "L2", 40), ("p0", "L0", 200)]
    assert status.completed == 3 and status.active_episodes == 0
    assert status.generated_tokens == 248 and status.worker_id == w.address


def test_several_trajectories_per_message():
    with sim_worker(seconds_per_token=0.0, max_concurrency=64) as w, \
            grpc.insecure_channel(w.address) as ch:
        req = sao_pb2.GenerateRequest(leases=[lease(i) for i in range(40)])
        responses = list(sao_pb2_grpc.RolloutWorkerStub(ch).Generate(iter([req]), timeout=30))
    assert sum(len(r.finished) for r in responses) == 40
    assert len(responses) < 40


def test_episode_error_and_cancel_travel_as_values():
    with sim_worker(seconds_per_token=5e-3) as w, grpc.insecure_channel(w.address) as ch:
        bad = sao_pb2.Lease(lease_id="bad", prompt_id="x", prompt_json='{"length": "many"}')
        reqs = [sao_pb2.GenerateRequest(leases=[bad, lease(1, 1000), lease(2, 4)]),
                sao_pb2.GenerateRequest(cancel_lease_ids=["L1"])]
        finished = [f for r in sao_pb2_grpc.RolloutWorkerStub(ch).Generate(iter(reqs), timeout=30)
                    for f in r.finished]
    got = {f.lease_id: f.WhichOneof("result") for f in finished}
    assert got == {"bad": "error", "L2": "trajectory"}  # L1 was cancelled
    assert "ValueError" in next(f.error for f in finished if f.lease_id == "bad")


def test_staleness_lag_and_budget():
    t = good_trajectory(version=3)
    assert staleness.lag(t, 5) == 2
    assert staleness.is_stale(t, 5, tau=1) and not staleness.is_stale(t, 5, tau=2)
    t.action_mask[:] = False
    assert staleness.lag(t, 9) == 0
    assert staleness.max_in_flight(8, 0) == 8 and staleness.max_in_flight(8, 4) == 40
    with pytest.raises(ValueError):
        staleness.max_in_flight(0, 1)
