"""The worker service directly over gRPC, and the staleness arithmetic."""
import os
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


def _refusal(version, uri="/run/publish/v1/params", *, served=0, served_uri=None,
             publish_root="/run/publish", max_version_jump=100):
    from sao.fleet.worker import weights_request_error
    return weights_request_error(version, uri, served=served, served_uri=served_uri,
                                 publish_root=publish_root, max_version_jump=max_version_jump)


@pytest.mark.parametrize("kwargs,match", [
    (dict(version=2**62), "outside"), (dict(version=2**31), "outside"),
    (dict(version=-1, served=-1), "outside"),
    (dict(version=3, served=5), "older"),
    (dict(version=5, served=5, served_uri="/run/publish/v5/params"), "already served"),
    (dict(version=5, served=5), "already served"),
    (dict(version=10**6), "max_version_jump"), (dict(version=101), "max_version_jump"),
    (dict(version=1, uri="/etc/passwd"), "publish root"),
    (dict(version=1, uri="/run/publish/../other/params"), "publish root"),
    (dict(version=1, uri="/run/publishing/v1"), "publish root"),
    (dict(version=1, uri="/run/publish"), "publish root"),
    (dict(version=1, uri="gs://bucket/run/publish/v1"), "publish root"),
    (dict(version=1, uri=""), "publish root"),
])
def test_weights_request_refusals(kwargs, match):
    assert match in _refusal(**kwargs)


def publish_tree(root, versions, latest=None):
    """The layout ``sao.ckpt.publish`` leaves: version directories with
    ``params`` and the ``LATEST`` marker (``latest``: the marker's version)."""
    import json
    from sao.fleet.published import version_dir
    for v in versions:
        os.makedirs(os.path.join(version_dir(str(root), v), "params"), exist_ok=True)
    latest = max(versions) if latest is None else latest
    (root / "LATEST").write_text(json.dumps({"version": latest, "path": f"v{latest:010d}"}))


def test_publish_manifest_names_match_the_learners():
    from sao import ckpt
    from sao.fleet import published
    assert (published.LATEST_MARKER, published.PARAMS_DIR) == (ckpt.LATEST_MARKER, ckpt.PARAMS_DIR)
    assert published.version_dir("/r", 7) == ckpt._version_dir("/r", 7)


@pytest.mark.parametrize("kwargs", [
    dict(version=1), dict(version=100), dict(version=2**31 - 1, served=-1),  # first weights
    dict(version=1, uri="file://{root}/v0000000001/params"),
    dict(version=5, served=5, uri="{root}/v0000000005/params",
         served_uri="{root}/v0000000005/params"),  # a retry
    dict(version=10**6, max_version_jump=None, publish_root=None, uri="mem://x"),
])
def test_weights_request_accepted(kwargs, tmp_path):
    root = tmp_path / "publish"
    root.mkdir()
    publish_tree(root, [1, 5, 100, 2**31 - 1])
    version = kwargs["version"]
    kwargs = {k: v.format(root=root) if isinstance(v, str) else v for k, v in kwargs.items()}
    kwargs.setdefault("uri", str(root / f"v{version:010d}" / "params"))
    kwargs.setdefault("publish_root", str(root))
    assert _refusal(**kwargs) is None


@pytest.mark.parametrize("version,uri,match", [
    (51, "v0000000051", "not published"),          # a jump past the manifest's latest
    (3, "v0000000003", "no longer published"),     # not in the tree (pruned)
    (2, "v0000000001", "not where version 2"),     # version 1's weights labelled 2
    (1, "v0000000001", "no publish manifest"),     # (with the marker removed)
])
def test_unpublished_versions_are_refused(tmp_path, version, uri, match):
    root = tmp_path / "publish"
    root.mkdir()
    publish_tree(root, [1, 2], latest=4)
    if match == "no publish manifest":
        (root / "LATEST").unlink()
    assert match in _refusal(version, str(root / uri / "params"), publish_root=str(root))


def test_publish_root_resolves_symlinks(tmp_path):
    root, outside = tmp_path / "publish", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    publish_tree(root, [2])
    (root / "v0000000001").symlink_to(outside)
    assert "publish root" in _refusal(1, str(root / "v0000000001" / "params"),
                                      publish_root=str(root))
    assert _refusal(2, str(root / "v0000000002" / "params"), publish_root=str(root)) is None


def test_refused_update_is_an_error_value_and_changes_nothing(tmp_path):
    root = tmp_path / "publish"
    root.mkdir()
    publish_tree(root, [1])
    v1 = str(root / "v0000000001" / "params")
    with sim_worker(publish_root=str(root)) as w, grpc.insecure_channel(w.address) as ch:
        stub = sao_pb2_grpc.RolloutWorkerStub(ch)
        update = lambda v, uri: stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=v, uri=uri),
                                                   timeout=10)
        r = update(2**62, str(root / "v" / "params"))
        assert not r.ok and r.version == 0 and r.error.startswith("ValueError: refused: version")
        assert "publish root" in update(1, "/tmp/evil").error
        assert update(1, v1).ok
        assert update(1, v1) == sao_pb2.UpdateWeightsResponse(ok=True, version=1)
        assert not update(1, str(root / "v1b" / "params")).ok
        assert w.engine.version == 1 and w.engine.weight_uris == [v1]
        assert w.server.servicer.refused_updates == 3
        assert stub.Status(sao_pb2.StatusRequest(), timeout=10).refused_updates == 3  # visible remotely
