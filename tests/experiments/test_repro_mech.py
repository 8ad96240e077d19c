"""Round-two arms (experiments/repro/mech.py): the mechanisms are on in every arm, the
arms differ only where their files say, and the drift arms share their own warm start."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.repro import ARM_NAMES, base, mech, sft_arm_of, sweep  # noqa: E402


@pytest.fixture(scope="module")
def configs():
    return {a: sweep.arm_config(a, 2, []) for a in ARM_NAMES}


def test_mechanisms_are_on_in_every_arm(configs):
    for arm, c in configs.items():
        assert c.name == arm and c.seed == 2
        assert c.rollout.engine_dtype == "bfloat16" and c.model.param_dtype == "float32"
        assert c.env.tool_latency_median_s == mech.LATENCY_S and c.env.tool_latency_sigma == 1.5
        assert c.env.tool_failure_rate == mech.FAILURE_RATE
        assert c.rollout.max_turns == c.env.max_tool_calls + 1
        assert c.learner.actor_lr == mech.ACTOR_LR and c.eval.value_episodes > 0
        updates = 2 * mech.DRIFT_PHASE if "drift" in arm else mech.STEPS   # + critic warm-up
        assert base.planned_budget(c)["actor_updates"] == updates, arm
        assert c.run.steps == updates + base.planned_budget(c)["critic_only_steps"]


def test_arms_differ_where_their_files_say(configs):
    c = configs
    assert c["m_grpo_sync"].rollout.tau == 0 and c["m_grpo"].rollout.tau == c["m_sao"].rollout.tau
    assert c["m_grpo"].learner.policy_loss == c["m_vapo"].learner.policy_loss == "ppo_clip"
    assert c["m_sao"].learner.policy_loss == c["m_grpo_dis"].learner.policy_loss == "sao_dis"
    assert (c["m_sao"].critic.critic_steps, c["m_sao_k1"].critic.critic_steps) == (2, 1)
    assert c["m_sao"].critic.critic_freeze_regex and not c["m_sao_full_critic"].critic.critic_freeze_regex
    assert c["m_sao"].critic.value_pretrain_steps > 0 == c["m_sao_no_pretrain"].critic.value_pretrain_steps
    d = c["m_drift_sao"]
    assert d.sft.style_mix == mech.DRIFT_STYLE_MIX and not c["m_sao"].sft.style_mix
    assert tuple(d.env.drift_schedule) == (mech.DRIFT_PHASE,)
    assert mech.DRIFT_PHASE >= 40


def test_warm_starts_are_shared_within_each_runs_directory():
    main = [a for a in ARM_NAMES if "drift" not in a]
    assert {sft_arm_of(a) for a in main} == {"m_sao"}
    assert {sft_arm_of(a) for a in ARM_NAMES if "drift" in a} == {"m_drift_sao"}
    sweep.check_shared_sft(main + ["sao", "grpo"], 0, [])  # round one's arms: the same SFT
    sweep.check_shared_sft(["m_drift_sao", "m_drift_running_mean"], 0, [], "m_drift_sao")
    with pytest.raises(ValueError, match="warm-starts differently"):
        sweep.check_shared_sft(["m_sao", "m_drift_sao"], 0, [])


def test_every_arm_of_a_seed_is_pointed_at_one_value_set(tmp_path, monkeypatch):
    runs = str(tmp_path)
    drift_sft = sweep.sft_dir(runs, 5, "m_drift_sao")
    assert drift_sft == os.path.join(runs, "_sft_m_drift_sao", "seed5") != sweep.sft_dir(runs, 5)
    for d in (sweep.sft_dir(runs, 5), drift_sft):
        os.makedirs(os.path.join(d, "sft"))
    cmds = []
    monkeypatch.setattr(sweep, "_run_logged", lambda cmd, log: cmds.append(cmd) or 0)
    for arm in ("m_sao", "m_sao_k1", "m_grpo", "m_drift_sao", "m_drift_running_mean"):
        sweep.run_one(runs, arm, 5, ["run.steps=2"], max_attempts=1)
    value_file = "--config.eval.value_episodes_file={}/value_heldout.bin"
    main, drift = cmds[:3], cmds[3:]
    assert all(value_file.format(sweep.sft_dir(runs, 5)) in cmd for cmd in main)
    assert all(value_file.format(drift_sft) in cmd for cmd in drift) and len(cmds) == 5
    assert "--config.run.steps=2" in cmds[2]                 # GRPO: no critic warm-up
    assert "--config.run.steps=2" not in cmds[0]             # SAO: 2 actor updates + warm-up


def test_one_sweep_trains_each_warm_start_once_per_seed(tmp_path, monkeypatch):
    # The round-two arms in one runs directory: per seed, the shared SFT before the main
    # arms and the drift arms' own SFT before theirs; nothing trained twice.
    runs, calls = str(tmp_path), []
    monkeypatch.setattr(sweep, "ensure_sft",
                        lambda r, seed, o, sft_arm: calls.append(("sft", sft_arm, seed)) or True)
    monkeypatch.setattr(sweep, "check_shared_sft", lambda *a: None)
    monkeypatch.setattr(sweep, "run_one",
                        lambda r, arm, seed, o, max_attempts: calls.append((arm, seed)) or "done")
    sweep._run_locked(runs, ["m_sao", "m_drift_sao", "m_grpo", "m_drift_running_mean"], [0, 1],
                      [], 1, None)
    for seed in (0, 1):
        mine = [c for c in calls if c[-1] == seed]
        assert mine == [("sft", "m_sao", seed), ("m_sao", seed), ("m_grpo", seed),
                        ("sft", "m_drift_sao", seed), ("m_drift_sao", seed),
                        ("m_drift_running_mean", seed)]
