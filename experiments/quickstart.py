"""Quick start: a tiny byte-level policy learns *when to call the Python tool* with SAO, on a CPU.

    make run        # = python -m sao.main --config=experiments/quickstart.py --workdir=runs/quickstart

What happens (13.5 minutes measured with two runs sharing 2 CPU cores; docs/quickstart.md):

1. SFT warm start of the ``tiny`` preset on reasoning-gym ``basic_arithmetic``
   demonstrations (two terms of 1-2 digits), of which only ``sft.tool_fraction`` call the tool
   (``<python>print(expr)</python><output>…</output><answer>…</answer>``); the
   rest answer directly, which a tiny model cannot do reliably.
2. Held-out pass@1 on ``eval.num_prompts`` prompts before RL.
3. Value pretraining of the critic on trajectories of the SFT policy.
4. Asynchronous SAO with ``rollout.num_workers`` local rollout worker
   processes over gRPC, the Python tool in the sandbox and reasoning-gym's grader.
5. Held-out pass@1 every ``eval.every`` steps and at the end; a summary table
   and ``summary.json`` in the workdir. Rerunning resumes (SFT, the first
   evaluation and checkpoints are cached in the workdir).

Variants: ``:0`` (default) to ``:3`` set the seed, e.g. ``--config=experiments/quickstart.py:1``.
"""
from experiments import common

VARIANTS = ("0", "1", "2", "3")


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "0")
    c = common.cpu(common.base())
    c.name = "quickstart"
    c.seed = int(variant)                    # init, sampling and prompt order
    # From common.cpu(): the tiny preset (d=128, 2 layers, 0.43M params), byte-level tokenizer,
    # 10% of the prompts held out, 200 of them evaluated every 10 steps, 30 steps.
    # learner / critic: SAO as in the paper, scaled for a tiny model.
    c.learner.batch_size = 32                # trajectories per step, one per prompt
    c.learner.length_buckets = (96, 128)     # episodes fit rollout.max_len=128; batches of 32 fit 96
                                             # (longest ~85): same update at ~half the compute
    c.learner.actor_lr = 2e-4                # tiny model: larger steps than 30B (1e-3 wrecked the SFT skills)
    c.critic.value_pretrain_steps = 30       # critic steps of value pretraining (max)
    c.critic.value_pretrain_ev = 0.5         # ... or until this explained variance
    c.train.value_pretrain_trajectories = 128  # samples of the SFT policy it is fitted on
    # rollout: cpu()'s 2 local worker processes with the JAX engine; short episodes.
    c.rollout.max_concurrency = 32
    c.rollout.engine_slots = 32
    c.rollout.max_len = 128
    c.rollout.max_new_tokens = 40
    c.rollout.max_turns = 2
    c.rollout.tau = 2                        # staleness bound (versions)
    # env: "Calculate 37 + 45 * 2." style prompts, question only, tags tool format.
    c.env.max_tool_calls = 1
    c.env.task_config.basic_arithmetic.max_terms = 2   # short expressions: easy to copy into the tool call
    # sft: half of the demonstrations call the tool (copying the expression and
    # the tool's output needs that many examples); the other half answer directly.
    c.sft.steps = 1000                       # 500 steps: 10% held-out pass@1; 1000: ~45%
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.num_demos = 8000
    c.sft.tool_fraction = 0.5
    return common.finalize(c)
