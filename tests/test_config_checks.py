"""Config consistency after ``--config.*`` overrides: `sao.config_checks` and its use by ``sao.main``."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_main_support import ROOT, run_main  # noqa: E402

from sao import config_checks  # noqa: E402
from sao.analysis import experiment_config  # noqa: E402

QUICKSTART = os.path.join(ROOT, "experiments", "quickstart.py")


def quickstart(**overrides):
    cfg = experiment_config(QUICKSTART)
    with cfg.unlocked():
        for key, value in overrides.items():
            group, name = key.split("__")
            cfg[group][name] = value
    return cfg


def test_the_shipped_quickstart_has_no_problem():
    assert config_checks.problems(experiment_config(QUICKSTART)) == []


@pytest.mark.parametrize("overrides, reason", [
    (dict(rollout__max_len=512), "largest learner.length_buckets 128 < rollout.max_len 512"),
    (dict(learner__advantage_estimator="grpo", rollout__group_size=1), "rollout.group_size >= 2"),
    (dict(learner__pad_id=0), "pads with id 256; learner.pad_id is 0"),
    (dict(model__preset="tiny-typo"), "unknown model.preset 'tiny-typo'"),
    (dict(model__init="/nonexistent/model.gguf"), "model.init /nonexistent/model.gguf: no such"),
    # SGLang's log-probs are untruncated: a ratio against them under top-p / top-k is biased.
    (dict(rollout__engine="sglang", rollout__top_p=0.9), "rollout.engine='sglang' reports"),
    (dict(rollout__engine="sglang", rollout__top_k=20, learner__policy_loss="ppo_clip"),
     "learner.policy_loss='ppo_clip' takes its importance ratio"),
    # The endpoint's Hermes dialect adds a tools system turn the question-only prompt lacks.
    (dict(env__harness="reference", eval__where="fleet", env__tool_format="hermes"),
     "env.prompt_style='question' with env.harness='reference'"),
])
def test_each_inconsistency_is_named(overrides, reason):
    cfg = quickstart(**overrides)
    assert any(reason in p for p in config_checks.problems(cfg)), config_checks.problems(cfg)
    with pytest.raises(ValueError, match="quickstart"):
        config_checks.check(cfg)


def test_main_refuses_bad_overrides_and_a_workdir_that_is_a_file(tmp_path):
    """Both fail before any worker starts: exit 1 with the reason, nothing written."""
    workdir = tmp_path / "run"
    proc = run_main(str(workdir), 1, "--config.rollout.max_len=512", "--config.model.preset=nope")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "rollout.max_len 512" in proc.stderr and "unknown model.preset 'nope'" in proc.stderr
    assert not workdir.exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = run_main(str(a_file), 1)
    assert proc.returncode == 1 and "is a file" in proc.stderr, proc.stderr[-2000:]
    assert a_file.read_text() == "x"


def test_main_names_a_misspelt_field_or_a_missing_config_file_without_a_traceback(tmp_path):
    workdir = tmp_path / "run"
    proc = run_main(str(workdir), 1, "--config.run.stepz=5")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert 'sao: bad --config: \'stepz\' Did you mean "steps"' in proc.stderr
    assert "Traceback" not in proc.stderr
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "sao.main", "--config=experiments/quickstat.py",
                           f"--workdir={workdir}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "No such file or directory: 'experiments/quickstat.py'" in proc.stderr
    assert not workdir.exists()


def test_sglang_without_truncation_or_with_the_jax_engine_is_accepted():
    # The JAX engine reports the truncated distribution's log-probs (tests/models); SGLang
    # untruncated is unbiased; a loss without an engine ratio (gspo) does not care.
    for overrides in (dict(rollout__engine="jax", rollout__top_p=0.9, rollout__top_k=20),
                      dict(rollout__engine="sglang"),
                      dict(rollout__engine="sglang", rollout__top_p=0.9,
                           learner__policy_loss="gspo")):
        assert not [p for p in config_checks.problems(quickstart(**overrides)) if "sglang" in p]


def test_ratio_losses_list_matches_the_learner():
    from sao.learner import steps
    assert set(config_checks.ROLLOUT_RATIO_LOSSES) == set(
        steps.ROLLOUT_BEHAVIOUR_LOSSES + steps.ROLLOUT_KWARG_LOSSES)
