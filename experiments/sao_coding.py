"""SAO on coding (HumanEval-style): DIS band (0.8, 3.0), code answers run against tests in the sandbox.

Commands (from the repository root)::

    python -m sao.main --config=experiments/sao_coding.py:cpu --workdir=runs/sao_coding_cpu
    python -m sao.main --config=experiments/sao_coding.py:qwen3_30b_a3b --workdir=gs://BUCKET/sao_coding
    python launch/gpu_slurm.py --config=experiments/sao_coding.py:qwen3_30b_a3b --dry-run

Variants: ``cpu`` (tiny byte-level model on HumanEval: exercises the pipeline,
learns nothing useful) and full-scale ``qwen3_30b_a3b`` (default),
``qwen3_8b``, ``qwen3_1p7b``. The paper's coding result is SWE-Bench Verified
(23.0 -> 27.0 GRPO+DIS -> 29.8 SAO); HumanEval is the offline stand-in here.
"""
from experiments import common

VARIANTS = ("cpu",) + tuple(common.FULL_SCALE)


def get_config(arg=None):
    variant = common.parse_variant(arg, VARIANTS, "qwen3_30b_a3b")
    c = common.base()
    c.name = "sao_coding"
    c.learner.eps_low = 0.8                  # coding band: ratio in (0.2, 4.0)
    c.learner.eps_high = 3.0
    if variant == "cpu":
        c = common.cpu(c)
        c.learner.length_buckets = (1024, 2048)
        c.rollout.max_len = 2048             # HumanEval prompts are long (bytes)
        c.rollout.max_new_tokens = 64
        c.sft.steps = 0                      # no demonstrations for code
        c.eval.num_prompts = 16
        c.run.steps = 2
    else:
        c = common.full_scale(c, variant)
        c.env.max_tool_calls = 8             # the agent may run code before answering
        c.env.tool_timeout_s = 20.0          # test suites need longer
    c.env.tasks = ("humaneval",)             # 164 tasks, tests run in the sandbox
    c.env.grader = "tests"                   # reward 1 when all tests pass
    c.data.heldout_fraction = 0.2            # 164 tasks: ~33 held out
    return common.finalize(c)
