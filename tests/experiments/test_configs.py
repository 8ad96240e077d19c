"""Every experiment config loads for every variant, is locked, and feeds LearnerConfig.

Full-scale model presets are checked by shape only (``nnx.eval_shape``).
"""
import dataclasses
import importlib
import os
import sys

import ml_collections
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import common  # noqa: E402
from sao.models.value import ATTENTION_PARAMS_REGEX  # noqa: E402

FILES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "experiments"))
               if f.endswith(".py") and f not in ("__init__.py", "common.py"))
CASES = [(name, variant) for name in FILES
         for variant in importlib.import_module(f"experiments.{name}").VARIANTS]


def test_every_paper_configuration_has_a_file():
    expected = {"quickstart", "sao_math", "grpo_math", "grpo_dis_math", "sao_dis_only", "vapo_math",
                "running_mean", "sao_k1", "sao_full_critic", "sao_coding", "online_drift"}
    assert expected <= set(FILES)


@pytest.mark.parametrize("name,variant", CASES)
def test_config_loads_locked_and_valid(name, variant):
    from sao.components import learner_config, running_mean_baseline
    from sao.learner.config import LearnerConfig
    module = importlib.import_module(f"experiments.{name}")
    assert "python -m sao.main --config=experiments/" + name in module.__doc__
    cfg = module.get_config(variant)
    assert isinstance(cfg, ml_collections.ConfigDict) and cfg.is_locked
    with pytest.raises(AttributeError):
        cfg.learner.not_a_field = 1
    for group in ("model", "learner", "critic", "train", "rollout", "env", "data", "eval", "checkpoint",
                  "run"):
        assert group in cfg, group
    if variant.startswith("cpu") or name == "quickstart":
        assert cfg.model.preset == "tiny" and cfg.rollout.engine == "jax"
    elif variant == "smollm2_cpu":         # the real SmolLM2-135M GGUF on local JAX workers
        assert cfg.model.preset == "smollm2-135m" and cfg.model.init.endswith(".gguf")
        assert (cfg.model.tokenizer, cfg.env.tool_format, cfg.rollout.engine) == ("hf", "hermes", "jax")
    elif variant == "fleet_cpu":           # an HF model given by the launcher, served by SGLang
        assert (cfg.model.tokenizer, cfg.env.tool_format, cfg.rollout.engine) == ("hf", "hermes", "sglang")
        assert cfg.checkpoint.hf_export and cfg.eval.where == "auto"
    else:
        assert cfg.model.preset.startswith("qwen3") and cfg.rollout.engine == "sglang"
    lc = learner_config(cfg)
    baseline = running_mean_baseline(cfg)
    if cfg.learner.advantage_estimator == "running_mean":
        # The RL loop computes the advantages (sao.learner.baselines); the learner gets them "given".
        assert lc.advantage_estimator == "given" and not lc.uses_critic
        assert baseline.window == cfg.train.running_mean_window
        assert baseline.scope == ("global" if name == "online_drift" else "prompt")
    else:
        assert baseline is None
    assert isinstance(lc, LearnerConfig) and lc.batch_size == cfg.learner.batch_size
    cfg.rollout.temperature = 0.6          # an override after get_config reaches the learner too
    assert learner_config(cfg).temperature == 0.6


def test_paper_values():
    from experiments import sao_math, grpo_math, sao_coding, sao_k1, sao_full_critic
    c = sao_math.get_config()
    assert (c.learner.eps_low, c.learner.eps_high, c.critic.critic_steps) == (0.3, 5.0, 2)
    assert (c.critic.critic_warmup_steps, c.learner.alpha, c.critic.lam_critic) == (10, 1.5, 1.0)
    assert (c.learner.batch_size, c.learner.actor_lr, c.critic.critic_lr) == (128, 1e-6, 5e-6)
    assert c.critic.critic_freeze_regex == ATTENTION_PARAMS_REGEX
    g = grpo_math.get_config()
    assert (g.learner.batch_size // g.rollout.group_size, g.rollout.group_size) == (16, 8)
    assert (g.learner.eps_low, g.learner.eps_high) == (0.2, 0.28)
    assert (sao_coding.get_config().learner.eps_low, sao_coding.get_config().learner.eps_high) == (0.8, 3.0)
    assert sao_k1.get_config().critic.critic_steps == 1
    assert sao_full_critic.get_config().critic.critic_freeze_regex == ""


def test_unknown_variant_and_override():
    from experiments import sao_math
    with pytest.raises(ValueError, match="unknown variant"):
        sao_math.get_config("gpu9000")
    cfg = sao_math.get_config("cpu")
    cfg.run.steps = 3          # locked configs still accept overrides of existing fields
    assert cfg.run.steps == 3


@pytest.mark.parametrize("preset", sorted({common.FULL_SCALE[v]["preset"] for v in common.FULL_SCALE}))
def test_full_scale_models_shape_only(preset):
    import jax
    from flax import nnx
    from sao.models import Transformer, get_preset
    cfg = get_preset(preset)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    expected = {"qwen3-30b-a3b": 30.5e9, "qwen3-8b": 8.2e9, "qwen3-1.7b": 1.72e9}[preset]
    assert abs(n - expected) / expected < 0.03, (preset, n)


def test_coding_tasks_grade_with_the_configured_sandbox_limits():
    from experiments import sao_coding
    from sao.components import make_tasks
    for variant in ("cpu", "qwen3_8b"):
        cfg = sao_coding.get_config(variant)
        task = make_tasks(cfg)["humaneval"]
        assert task.limits.timeout_s == cfg.env.tool_timeout_s
        assert task.limits.memory_mb == cfg.env.tool_memory_mb
    assert cfg.env.tool_timeout_s == 20.0  # full scale: test suites need longer than the default


def test_learner_groups_are_learner_config_defaults():
    """base() takes learner / critic from LearnerConfig; only the full-scale shape keys differ."""
    from sao.learner.config import CRITIC_FIELDS, DERIVED_FIELDS, LearnerConfig
    c, defaults = common.base(), LearnerConfig()
    assert set(c.critic) == set(CRITIC_FIELDS)
    assert set(c.learner) | set(c.critic) | set(DERIVED_FIELDS) == {
        f.name for f in dataclasses.fields(LearnerConfig)}
    differ = {k for group in (c.learner, c.critic) for k, v in group.items()
              if v != getattr(defaults, k)}
    assert differ == {"batch_size", "length_buckets", "micro_batch_size", "pad_id", "deterministic"}
    assert c.learner.lam_policy is None                      # length-adaptive
    c.learner.lam_policy = 0.95                              # a typed placeholder: overridable
    assert c.learner.lam_policy == 0.95
