"""Round-two arms (experiments/repro/mech.py): the mechanisms are on in every arm, the
arms differ only where their files say, and the drift arms share their own warm start."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.repro import MECH_ARM_NAMES, mech, sweep  # noqa: E402


@pytest.fixture(scope="module")
def configs():
    return {a: sweep.arm_config(a, 2, []) for a in MECH_ARM_NAMES}


def test_mechanisms_are_on_in_every_arm(configs):
    for arm, c in configs.items():
        assert c.name == arm and c.seed == 2
        assert c.rollout.engine_dtype == "bfloat16" and c.model.param_dtype == "float32"
        assert c.env.tool_latency_median_s == mech.LATENCY_S and c.env.tool_latency_sigma == 1.5
        assert c.env.tool_failure_rate == mech.FAILURE_RATE
        assert c.rollout.max_turns == c.env.max_tool_calls + 1
        assert c.learner.actor_lr == mech.ACTOR_LR and c.eval.value_episodes > 0
        assert c.run.steps == (2 * mech.DRIFT_PHASE if "drift" in arm else mech.STEPS)


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
    main = [a for a in MECH_ARM_NAMES if "drift" not in a]
    sweep.check_shared_sft(main, 0, [])                     # the round-one SFT (sao's)
    sweep.check_shared_sft(["m_drift_sao", "m_drift_running_mean"], 0, [], "m_drift_sao")
    with pytest.raises(ValueError, match="warm-starts differently"):
        sweep.check_shared_sft(["m_sao", "m_drift_sao"], 0, [])


def test_every_arm_of_a_seed_is_pointed_at_one_value_set(tmp_path, monkeypatch):
    runs = str(tmp_path)
    os.makedirs(os.path.join(sweep.sft_dir(runs, 5), "sft"))
    cmds = []
    monkeypatch.setattr(sweep, "_run_logged", lambda cmd, log: cmds.append(cmd) or 0)
    for arm in ("m_sao", "m_sao_k1"):
        sweep.run_one(runs, arm, 5, ["run.steps=2"], max_attempts=1)
    want = f"--config.eval.value_episodes_file={sweep.sft_dir(runs, 5)}/value_heldout.bin"
    assert all(want in cmd and "--config.run.steps=2" in cmd for cmd in cmds) and len(cmds) == 2
