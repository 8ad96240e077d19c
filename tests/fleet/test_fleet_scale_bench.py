"""Smoke test of benchmarks/fleet_scale.py: a tiny sweep gives a complete, consistent
report (no timing thresholds), and its simulated workers send valid trajectories."""
import asyncio
import pathlib
import secrets
import sys

import pytest

from sao.types import validate

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import fleet_hosts  # noqa: E402  (benchmarks/ is a directory of scripts, not a package)
import fleet_scale  # noqa: E402

TINY = ["--n", "1,2", "--train_s", "0.02", "--long_scale", "2", "--hosts", "2",
        "--batch_size", "8", "--warmup_s", "0.2", "--window_s", "0.5",
        "--median_len", "64", "--min_len", "32", "--max_len", "128", "--concurrency", "16"]


@pytest.mark.parametrize("length,truncated", [(32, False), (300, True), (4096, False)])
def test_simulated_episode_is_valid(length, truncated):
    engine = fleet_hosts.VersionEngine()
    asyncio.run(engine.load_weights(3, "/publish/3"))
    traj = asyncio.run(fleet_hosts.episode_fn(engine, 0.0, seed=1)(
        {"length": length, "reward": 1.0, "truncated": truncated}))
    assert traj.length == length and traj.num_action_tokens == length - length // 8
    assert traj.finish == ("length" if truncated else "stop")
    assert set(traj.policy_version.tolist()) == {3}
    assert validate(traj, vocab_size=fleet_hosts.VOCAB, learner_version=3) is None
    assert validate(traj, vocab_size=fleet_hosts.VOCAB, learner_version=2) == "future_version"


def test_hosts_spread_addresses_and_stop():
    with fleet_hosts.Hosts(3, 2, secrets.token_urlsafe(16), concurrency=4,
                           seconds_per_token=0.0, seed=0) as hosts:
        assert len(hosts.procs) == 2 and len(set(hosts.addresses)) == 3
        assert hosts.cpu_s() > 0
    assert all(p.returncode is not None for p in hosts.procs)


def test_tiny_sweep_report():
    report = fleet_scale.main(TINY)
    assert report["workers"] == 2 and report["hosts"] == 2 and report["cpus"] >= 1
    assert [q["workers"] for q in report["push_idle"]] == [1, 2]
    assert all(q["push_ms_median"] > 0 and q["push_cpu_ms"] > 0 for q in report["push_idle"])
    assert report["decode_validate"]["decode_us"] > 0 and report["decode_validate"]["validate_us"] > 0
    raw, *runs = report["runs"]
    assert raw["kind"] == "raw" and raw["arrivals_per_s"] > 0 and raw["tokens_per_s"] > 0
    # train_s=0 at N=1 and N=2, the long run, then train_s=0.02
    assert [(r["workers"], r["train_s"], r["length_scale"]) for r in runs] == [
        (1, 0.0, 1), (2, 0.0, 1), (2, 0.0, 2), (2, 0.02, 1)]
    for r in runs:
        assert r["arrivals_per_s"] > 0 and r["steps"] >= 1, r
        assert r["trained_per_s"] == pytest.approx(r["steps"] * 8 / r["window_s"], rel=0.02)
        # every trained trajectory holds between min_len and max_len (x scale) tokens
        lo, hi = 32 * r["length_scale"], 128 * r["length_scale"]
        assert lo * r["trained_per_s"] * 0.98 <= r["trained_tokens_per_s"]
        assert r["trained_tokens_per_s"] <= hi * r["trained_per_s"] * 1.02
        assert 0.0 <= r["learner_idle_fraction"] <= 1.0 and 0.0 < r["push_fraction"] < 1.0
        assert r["learner_idle_fraction"] + r["push_fraction"] <= 1.0
        assert r["dispatcher_cores"] > 0 and r["worker_cores"] > 0
        assert r["traj_per_message"] >= 1.0 and r["mb_per_s"] > 0
        assert 0 <= r["mean_lag"] <= 4 and set(r["drops"]) <= {"stale"}, r
        parts = (r["link_threads_cpu_ms_per_traj"] + r["learner_thread_cpu_ms_per_traj"]
                 + r["other_cpu_ms_per_traj"])
        assert parts == pytest.approx(r["dispatcher_cpu_ms_per_traj"], abs=0.005)
    assert report["dispatcher_over_raw"] > 0 and report["n2_over_n1"] > 0
    assert 0 < report["decode_validate_share"]
