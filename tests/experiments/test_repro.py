"""The reproduction sweep (experiments/repro): arm configs, the driver's bookkeeping, the
report on missing runs, and (slow) a tiny sweep end to end: runs, skips on rerun, report."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.repro import (ARM_NAMES, ROUND_ONE_ARM_NAMES, base, mech, report,  # noqa: E402
                               results, sweep)
from experiments.repro import records as rec  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402


def _cfg(arm, seed=0, overrides=()):
    return sweep.arm_config(arm, seed, list(overrides))


@pytest.fixture(scope="module")
def configs():
    return {a: _cfg(a, 1) for a in ROUND_ONE_ARM_NAMES}      # round two's: test_repro_mech


def test_every_arm_file_is_listed():
    files = {f[:-3] for f in os.listdir(os.path.join(ROOT, "experiments", "repro"))
             if f.endswith(".py")} - {"__init__", "base", "sweep", "results", "report", "ev_study",
                                      "claims", "records", "progress", "verdicts", "mech",
                                      "pilot", "holdout"}
    assert files == set(ARM_NAMES) | set(ROUND_ONE_ARM_NAMES)


def test_arms_share_budget_seed_and_warm_start(configs):
    sft = None
    for arm, c in configs.items():
        assert c.name == arm and c.seed == 1 and c.data.shuffle_seed == 1
        assert c.learner.batch_size == base.BATCH and c.eval.align_actor_updates
        assert c.learner.batch_size % c.rollout.group_size == 0
        key = json.dumps({"model": c.model.to_dict(), "sft": c.sft.to_dict(),
                          "task": c.env.task_config.basic_arithmetic.to_dict()}, default=str)
        assert sft in (None, key), arm
        sft = key
    sweep.check_shared_sft(list(ROUND_ONE_ARM_NAMES), 1, [])


def test_every_arm_gets_the_same_actor_updates_and_charges_its_critic(configs):
    # Issue 22: the critic warm-up used to eat actor steps (SAO 38 updates to GRPO's 40).
    # A learner step updates the actor unless it is one of the critic's warm-up steps
    # (sao.learner.update: step >= critic_warmup_steps, with a critic).
    for arm, c in configs.items():
        warm = c.critic.critic_warmup_steps if c.learner.advantage_estimator == "gae" else 0
        assert c.run.steps - warm == base.STEPS, arm
        plan = base.planned_budget(c)
        assert (plan["actor_updates"], plan["actor_trajectories"]) == (base.STEPS,
                                                                        base.STEPS * base.BATCH)
        assert plan["critic_only_trajectories"] == warm * base.BATCH
        assert plan["planned"] == c.run.steps * base.BATCH + plan["pretraining"]
    assert base.planned_budget(configs["sao"])["critic_only_trajectories"] > 0
    assert base.planned_budget(configs["vapo"])["pretraining"] > 0
    assert base.planned_budget(configs["grpo"])["pretraining"] == 0


def test_arms_differ_where_their_files_say(configs):
    c = configs
    assert {a: c[a].rollout.tau for a in ("sao", "sao_tau1", "sao_tau8", "grpo", "grpo_tau1",
                                          "grpo_tau8", "grpo_sync")} == {
        "sao": 4, "sao_tau1": 1, "sao_tau8": 8, "grpo": 4, "grpo_tau1": 1, "grpo_tau8": 8,
        "grpo_sync": 0}
    assert (c["sao"].critic.critic_steps, c["sao_k1"].critic.critic_steps) == (2, 1)
    assert c["sao"].critic.critic_freeze_regex and not c["sao_full_critic"].critic.critic_freeze_regex
    # The ablations keep their critic design at CPU scale (common.cpu sets SAO's warm-up and
    # value pretraining; these arms have none / no warm-up).
    assert (c["sao_dis_only"].critic.critic_warmup_steps,
            c["sao_dis_only"].critic.value_pretrain_steps) == (0, 0)
    assert c["vapo"].critic.critic_warmup_steps == 0 and c["vapo"].critic.value_pretrain_steps > 0
    assert c["sao"].critic.critic_warmup_steps > 0 and c["sao"].critic.value_pretrain_steps > 0
    for a in ("grpo", "vapo", "grpo_tau1", "grpo_sync"):
        assert c[a].learner.policy_loss == "ppo_clip"
    for a in ("sao", "grpo_dis", "running_mean", "sao_dis_only"):
        assert c[a].learner.policy_loss == "sao_dis"
    assert c["grpo_dis"].learner.advantage_estimator == "grpo"
    assert c["drift_sao"].env.drift_schedule == base.DRIFT_SWITCHES
    assert c["drift_running_mean"].learner.advantage_estimator == "running_mean"


def test_bad_seed_and_mixed_overrides_are_refused(tmp_path):
    with pytest.raises(ValueError, match="integer seed"):
        base.parse_seed("x")
    with pytest.raises(ValueError, match=">= 0"):
        base.parse_seed("-1")
    sweep.check_sweep_file(str(tmp_path), ["run.steps=2"])
    sweep.check_sweep_file(str(tmp_path), ["run.steps=2"])
    with pytest.raises(ValueError, match="another --runs"):
        sweep.check_sweep_file(str(tmp_path), [])
    with pytest.raises(SystemExit):
        sweep.main(["status", "--runs", str(tmp_path), "--arms", "nope"])


def test_report_on_no_runs_invents_nothing(tmp_path):
    out, plots = tmp_path / "RESULTS.md", tmp_path / "plots"
    report.write_report(str(tmp_path / "runs"), str(out), str(plots), arms=list(ARM_NAMES),
                        seeds=[0, 1, 2])
    text = out.read_text()
    assert text.count("| pending | pending | pending |") == len(ARM_NAMES)
    assert "%" not in text.split("## Held-out pass@1")[1].split("### Paired against SAO")[0]
    paired_rows = text.split("### Paired against SAO")[1].split("## Value model")[0].splitlines()
    paired_rows = [r for r in paired_rows if r.startswith("| `")]
    assert len(paired_rows) == 7 and all(r.endswith("| — | — | — |") for r in paired_rows)
    assert "Not measured yet" in text
    assert "none recorded; 0 finished run(s) predate" in text
    assert sorted(os.listdir(plots)) == sorted(f"repro_{n}.png" for n in (
        "main", "critic_ev", "staleness", "drift", "wallclock"))


def test_collapse_and_time_to_target():
    rl = [{"step": 0, "time_s": 1.0, "eval/accuracy": 0.5}]
    for step in range(1, 31):                          # 2 s per RL step
        rl.append({"step": step, "time_s": 1.0 + 2 * step, "time/step_s": 2.0})
    for step, acc in ((10, 0.6), (20, 0.25), (30, 0.3)):
        rl[step]["eval/accuracy"] = acc
    run = results.Run("sao", 0, "done", {}, rl)
    assert run.collapse_step() == 20
    assert results.time_to(run, 0.55) == 20.0 and results.time_to(run, 0.9) is None
    rl[20]["eval/accuracy"] = 0.55                     # back above the start: no collapse
    assert run.collapse_step() is None


def test_a_resumed_run_that_reached_the_target_counts():
    # Issue 22: time_to gave None for a resumed run (its process clock restarts). The RL
    # clock sums each step's seconds, so the steps of both attempts count, once each.
    rl = [{"step": 0, "time_s": 50.0, "eval/accuracy": 0.3}]
    for step in range(1, 21):
        t = 50.0 + 3 * step if step <= 12 else 40.0 + 3 * (step - 12)   # resumed after step 12
        rl.append({"step": step, "time_s": t, "time/step_s": 3.0})
    rl[10]["eval/accuracy"], rl[20]["eval/accuracy"] = 0.4, 0.7
    run = results.Run("sao", 0, "done", {"accuracy_after": 0.7}, rl)
    assert results.time_to(run, 0.6) == 60.0 and results.time_to(run, 0.35) == 30.0
    assert run.timed_evals() == [(0.0, 0.3), (30.0, 0.4), (60.0, 0.7)]
    table, target = report.wallclock_table({"m_sao": [run], "m_grpo_sync": [
        results.Run("m_grpo_sync", 0, "done", {"accuracy_after": 0.7}, rl)]})
    assert target == pytest.approx(0.63) and "| `m_sao` | 1/1 | 60.000 (n=1) |" in table


def test_paired_differences_and_t_interval():
    def run(arm, seed, after, state="done"):
        return results.Run(arm, seed, state, {"accuracy_after": after}, [])
    runs = {"sao": [run("sao", 0, 0.5), run("sao", 1, 0.4), run("sao", 2, 0.7, "partial")],
            "grpo": [run("grpo", 0, 0.6), run("grpo", 1, 0.3), run("grpo", 2, 0.9)]}
    final = lambda r: r.summary["accuracy_after"]                       # noqa: E731
    # seed 2 of sao has not finished: that seed is not paired
    assert results.paired(runs, "grpo", "sao", final) == pytest.approx([0.1, -0.1])
    assert results.paired(runs, "vapo", "sao", final) == []
    m, lo, hi = results.t_interval([1.0, 2.0, 3.0])
    # hand: sd 1, se 1/sqrt(3), t_{0.975, 2 df} = 4.3027
    assert m == 2.0 and hi - m == pytest.approx(4.3027 / 3 ** 0.5, rel=1e-4) and m - lo == hi - m
    assert results.t_interval([1.0]) is None
    with pytest.raises(ValueError, match="level"):
        results.t_interval([1.0, 2.0], level=1.0)
    assert results.points_interval([0.01, 0.02, 0.03]) == "+2.0 [-0.5, +4.5] (n=3)"
    assert results.points_interval([0.05]) == "+5.0 (n=1)" and results.points_interval([]) == "—"


def test_drift_table_recomputes_adaptation_from_the_records():
    s1, = mech.DRIFT_SWITCHES                      # round two: one switch

    def run(seed, rewards):
        rl = [{"step": v + 1, "env/learner_step": v, "rollout/reward": r}
              for v, r in enumerate(rewards)]
        return results.Run("m_drift_sao", seed, "done", {"drift": "stale copy, not read"}, rl)
    # seed 0 is back at full reward 2 versions after the switch (lag: the version where the
    # last `window` rewards first average above the level); seed 1 never finds the style
    ok = [1.0] * s1 + [0.0, 0.5, 1.0, 1.0, 1.0] + [1.0] * 10
    lost = [1.0] * s1 + [0.0] * 15
    table = report.drift_table({"m_drift_sao": [run(0, ok), run(1, lost)]})
    row = next(r for r in table.splitlines() if r.startswith("| `m_drift_sao`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    window = sweep.arm_config("m_drift_sao", 0, []).env.drift_recovery_window
    assert cells[1] == f"{float(2 + window - 1):.3f} (n=1); recovered 1/2"
    assert cells[2].startswith("1.000 ± 0.000 (n=2) / ")


SMOKE = ["learner.batch_size=8", "run.steps=2", "sft.steps=3", "sft.num_demos=64",
         "eval.num_prompts=4", "eval.every=0", "critic.value_pretrain_steps=1",
         "train.value_pretrain_trajectories=8", "rollout.num_workers=1",
         "rollout.max_concurrency=8", "rollout.engine_slots=8", "rollout.max_new_tokens=16",
         "env.task_size=200", "checkpoint.every=1"]
# The round-two arms, with the latency model and the held-out critic set made small.
SMOKE_M = SMOKE + ["env.tool_latency_median_s=0.01", "env.tool_latency_max_s=0.1",
                   "eval.value_episodes=4"]


@pytest.mark.slow
def test_smoke_sweep_runs_skips_and_reports(tmp_path, monkeypatch):
    # The runs are child processes on one CPU device, as outside the tests.
    monkeypatch.setenv("XLA_FLAGS", cpu_devices(1))
    runs = str(tmp_path / "runs")
    arms = ["m_sao", "m_grpo"]   # the sweep's arms (experiments.repro.ARMS)
    records = str(tmp_path / "records")               # the committed folder's stand-in
    clean = rec.git_state()["clean"]                   # development trees are dirty
    states = sweep.run(runs, arms, [0], SMOKE_M, allow_dirty=True, records=records)
    logs = [os.path.join(sweep.sft_dir(runs, 0), "driver.log")] + [
        os.path.join(sweep.run_dir(runs, a, 0), "driver.log") for a in arms]
    assert states == {("m_sao", 0): "done", ("m_grpo", 0): "done"}, "\n".join(
        open(p).read()[-2000:] for p in logs if os.path.exists(p))
    for arm in arms:
        d = sweep.run_dir(runs, arm, 0)
        summary = json.load(open(os.path.join(d, "summary.json")))
        assert summary["budget"]["actor_updates"] == summary["policy_version"] == 2  # run.steps=2
        assert summary["steps"] == 2 + (2 if arm == "m_sao" else 0)   # + SAO's critic warm-up
        assert os.path.exists(os.path.join(d, "sft", "result.json"))   # the seed's shared SFT
    attempts = {a: json.load(open(os.path.join(sweep.run_dir(runs, a, 0), "attempts.json")))
                for a in arms}
    for arm in arms:                                   # recorded only from a clean commit
        assert rec.is_recorded(records, arm, 0) == clean
    assert sweep.run(runs, arms, [0], SMOKE_M, allow_dirty=True,
                     records=records) == states        # rerun: nothing to do
    for a in arms:
        assert json.load(open(os.path.join(sweep.run_dir(runs, a, 0), "attempts.json"))) == attempts[a]
    out = tmp_path / "RESULTS.md"
    assert sweep.main(["report", "--runs", records if clean else runs, "--arms", "m_sao,m_grpo",
                       "--seeds", "0", "--out", str(out), "--plots", str(tmp_path / "plots")]) == 0
    text = out.read_text()
    if not clean:                                      # a dirty tree's runs are never reported
        assert "| `m_sao` | SAO | dirty |" in text
        return
    assert "| `m_sao` | SAO | done |" in text and "(n=1)" in text
    attempts = json.load(open(os.path.join(sweep.run_dir(runs, "m_sao", 0), "attempts.json")))
    assert f"`{attempts['runs'][0]['commit'][:7]}` (2 runs); 0 finished run(s) predate" in text
    assert "(mean per training episode): none among 2 finished run(s)" in text
    assert os.path.getsize(tmp_path / "plots" / "repro_main.png") > 1000


def test_ev_study_metric_matches_the_kernel_and_renders():
    import numpy as np
    from sao import algo
    from experiments.repro import ev_study
    rng = np.random.default_rng(0)
    v, r = rng.normal(size=(4, 9)).astype(np.float32), rng.normal(size=(4, 9)).astype(np.float32)
    m = rng.random((4, 9)) < 0.6
    assert ev_study.explained_variance(v, r, m) == pytest.approx(
        float(algo.explained_variance(v, r, m)), abs=1e-5)
    assert ev_study.explained_variance(v, np.ones_like(r), m) == 0.0   # constant returns
    one = {"n": 64, "reward": 0.5, "tool_use": 0.5, "success_tool": 0.9, "success_no_tool": None,
           "ev_pooled": 0.3, "ev_batches": {"mean": 0.3, "std": 0.1, "min": 0.2, "max": 0.4},
           "ev_tool_oracle": 0.7, "refit": {"ev_in_sample": 0.6, "ev_held_out": 0.5}}
    text = ev_study.markdown({"run_dir": "r", "n": 64, "logged_ev": [[1, 0.5], [12, 0.1]],
                              "value_pretrain": {"steps": 2, "history": [0.0, 0.6]},
                              "checkpoints": {"10": one, "0": one}})
    assert "| 0 | 0.50 | 0.50 | 0.90 / — | 0.30 |" in text
    assert text.index("| 0 |") < text.index("| 10 |") and "steps 1-10 mean 0.50" in text


def test_one_sweep_at_a_time_per_runs_directory(tmp_path):
    import fcntl
    runs = str(tmp_path)
    sweep.check_sweep_file(runs, [])
    with open(os.path.join(runs, sweep.LOCK_FILE), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        with pytest.raises(RuntimeError, match="pid 4242"):
            sweep.run(runs, ["sao"], [0], [], allow_dirty=True, records=None)


_DRIVER = """
import sys
sys.path.insert(0, {root!r})
from experiments.repro import sweep
sweep.check_shared_sft = lambda *args: None
marker = {reversed_marker!r}[::-1]   # spelt backwards here: only the fake run's command has it
sweep._python_cmd = lambda *args: [sys.executable, "-c", "import time; time.sleep(120)", marker]
sweep.run({runs!r}, ["sao", "grpo"], [0], [], allow_dirty=True, records=None)
"""


def test_stop_ends_the_run_in_progress_without_counting_a_failure(tmp_path):
    import subprocess
    import time
    import uuid
    runs, marker = str(tmp_path / "runs"), f"sweep-stop-{uuid.uuid4().hex}"
    os.makedirs(os.path.join(sweep.sft_dir(runs, 0), "sft"))
    with open(os.path.join(sweep.sft_dir(runs, 0), "sft", "result.json"), "w") as f:
        f.write("{}")                                     # the seed's SFT exists: runs start at once
    assert sweep.stop(runs) == "no sweep has run here"
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER.format(
        root=ROOT, runs=runs, reversed_marker=marker[::-1])])

    def children():
        out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
        return out.split()

    # A bound, not a race: the driver imports JAX and checks the tree first (>60 s seen on
    # a 2-core machine running two test suites and the sweep).
    deadline = time.monotonic() + 300
    while not children() and time.monotonic() < deadline:
        assert driver.poll() is None, "the driver exited before starting a run"
        time.sleep(0.2)
    assert children(), "the fake run never started"
    assert sweep.stop(runs, timeout_s=60) == f"stopped the sweep (pid {driver.pid})"
    assert driver.wait(timeout=30) == 0                   # the driver returned (no traceback)
    assert not children()                                 # the run in progress was ended
    attempts = json.load(open(os.path.join(sweep.run_dir(runs, "sao", 0), sweep.ATTEMPTS_FILE)))
    assert [(a["rc"], a["stopped"]) for a in attempts["runs"]] == [(-15, True)]
    assert sweep.run_state(runs, "sao", 0) != "failed" and "gave_up" not in attempts
    assert not os.path.exists(sweep.run_dir(runs, "grpo", 0))   # nothing new started
    assert sweep.stop(runs) == "no sweep is running"
