"""The shared scale of the reproduction sweep (issue: the paper's claims at small scale).

Every arm in this directory is an existing experiment's ``cpu`` variant (its
learner / critic settings: the arm's identity) passed through :func:`repro`,
which sets what all arms share, so that arms differ only where their own file
says:

* **policy**: the ``tiny`` byte-level preset warm-started by SFT exactly as the
  quick start does (1000 steps, half of the demonstrations call the tool), on
  the sweep's task; the SFT weights depend only on the seed, so
  ``experiments.repro.sweep`` trains them once per seed and every arm of that
  seed starts from the same copy;
* **task**: reasoning-gym ``basic_arithmetic`` with 2-3 terms of 1-2 digits
  (harder than the quick start's 2 terms: no arm reaches the ceiling in the
  budget), up to 2 tool calls in 3 policy turns, so episodes are multi-turn
  with long-tailed lengths (a direct answer, one call, two calls);
* **fleet**: ``WORKERS`` local rollout workers with ``SLOTS`` episodes in
  flight each (192), more than the ``(tau + 1) x batch`` in-flight budget of
  tau <= 4 (160), so the staleness bound, not the fleet, sets how stale
  trained tokens are up to tau = 4; at tau = 8 (budget 288) the fleet's 192
  bound it;
* **budget** (:func:`planned_budget`): ``STEPS`` actor updates of ``BATCH``
  trajectories for every arm (GRPO: ``BATCH / 8`` prompts x 8 rollouts); an
  arm with a critic warm-up runs that many learner steps more (they update the
  critic alone), so that no arm loses actor updates to its critic; the
  warm-up's and the value pretraining's trajectories are charged to the arm
  (``summary.json``'s ``budget``, a column of every table). Held-out pass@1
  every 10 actor updates (``eval.align_actor_updates``).

Arm files take the seed as the variant: ``--config=experiments/repro/sao.py:1``.
"""
from __future__ import annotations

import ml_collections

from experiments import common

STEPS = 40                 # actor updates per run (round one; round two: mech.STEPS)
BATCH = 32                 # trajectories per learner step (all arms)
SEEDS = tuple(range(8))    # seeds of the main comparison (each: its own SFT policy, init, sampling,
                           # prompt order; PREREGISTRATION.md: >= 8 for SAO, GRPO, GRPO+DIS, VAPO)
SECONDARY_SEEDS = SEEDS[:4]  # seeds of the other comparisons (critic, drift, wall clock)
# Cost priors for `sweep status` before any run has finished, and for the budget check
# (tests/experiments): the first sweep on this machine (2 cores, shared, nice 19) took
# 2.38 h for 45 runs x 40 learner steps (process seconds per step, start-up and
# evaluations included) and 0.59 h for 3 SFT warm starts.
PRIOR_S_PER_STEP = 4.8
PRIOR_SFT_S = 710.0
EVAL_PROMPTS = 100         # held-out prompts per evaluation (the same ones in every arm of a seed)
EVAL_SAMPLES = 4           # samples per held-out prompt (pass@1 = their mean)
MAX_SWEEP_HOURS = 8.0      # the whole sweep must fit this at the priors (2 cores)
TAU = 4                    # staleness bound of the arms that do not vary it
WORKERS = 2                # rollout worker processes (JAX engine each)
SLOTS = 96                 # episodes in flight per worker (engine decode slots)
DRIFT_SWITCHES = (13, 26)  # online-drift arms: learner steps where the rewarded style switches

# What SFT depends on: every arm of one seed must agree on these groups (sweep checks).
SFT_KEYS = ("model", "sft")


def seeds_of(group: str) -> tuple[int, ...]:
    """The seeds an arm of comparison ``group`` (``experiments.repro.ARMS``) runs."""
    return SEEDS if group == "main" else SECONDARY_SEEDS


def parse_seed(arg: str | None) -> int:
    """The seed variant of ``--config=experiments/repro/<arm>.py:SEED``; raises ValueError."""
    try:
        seed = int(arg if arg not in (None, "") else 0)
    except ValueError:
        raise ValueError(f"repro arms take an integer seed as the variant, got {arg!r}") from None
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return seed


def planned_budget(c: ml_collections.ConfigDict, steps: int | None = None) -> dict[str, int]:
    """The trajectories an arm's config plans to spend (what ``run_metrics.budget`` records):
    ``actor_updates`` (``steps``; None: ``run.steps`` less the critic warm-up), ``actor_trajectories``, ``critic_only_steps`` (the critic
    warm-up, with a critic), ``critic_only_trajectories``, ``pretraining`` (value-pretraining
    samples) and their sum ``planned`` (before drops)."""
    critic = c.learner.advantage_estimator == "gae"
    warm = int(c.critic.critic_warmup_steps) if critic else 0
    pre = (int(c.train.value_pretrain_trajectories)
           if critic and c.critic.value_pretrain_steps else 0)
    b = int(c.learner.batch_size)
    steps = int(c.run.steps) - warm if steps is None else int(steps)
    return {"actor_updates": steps, "actor_trajectories": steps * b, "critic_only_steps": warm,
            "critic_only_trajectories": warm * b, "pretraining": pre,
            "planned": (steps + warm) * b + pre}


def repro(c: ml_collections.ConfigDict, arg: str | None, *, name: str,
          tau: int = TAU, steps: int = STEPS) -> ml_collections.ConfigDict:
    """Sets the sweep's shared scale (module doc) on an experiment's ``cpu`` config.

    Args:
      c: a finalised (locked) ``cpu`` config of an ``experiments/`` file; values
        may still change, no field is added.
      arg: the seed variant.
      name: the arm's name (``c.name``, the sweep's run directory).
      tau: staleness bound (0 = synchronous, with a barrier).
      steps: actor updates (the run adds its critic warm-up steps: ``run.steps``).
    Returns ``c``. Raises ValueError on a bad seed or an inconsistent result.
    """
    seed = parse_seed(arg)
    c.name = name
    c.seed = seed
    c.data.shuffle_seed = seed
    # policy: the quick start's warm start, on this task's demonstrations
    c.sft.steps = 1000
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.num_demos = 8000
    c.sft.tool_fraction = 0.5
    c.sft.max_len = 128
    # learner / critic: the quick start's scale
    c.learner.batch_size = BATCH
    c.learner.length_buckets = (128, 256)
    c.learner.actor_lr = 2e-4
    if c.critic.value_pretrain_steps:        # arms with value pretraining: the quick start's
        c.critic.value_pretrain_steps = 30
        c.critic.value_pretrain_ev = 0.5
        c.train.value_pretrain_trajectories = 128
    # rollout: a fleet with more in flight than the staleness budget
    c.rollout.num_workers = WORKERS
    c.rollout.max_concurrency = SLOTS
    c.rollout.engine_slots = SLOTS
    c.rollout.max_len = 256
    c.rollout.max_new_tokens = 48
    c.rollout.max_turns = 3
    c.rollout.tau = tau
    # env: 2-3 terms, up to two tool calls
    c.env.task_config.basic_arithmetic = ml_collections.ConfigDict(dict(
        min_terms=2, max_terms=3, min_digits=1, max_digits=2,
        operators=("+", "-", "*"), allow_negation=False))
    c.env.task_size = 4000
    c.env.max_tool_calls = 2
    c.env.max_observation_chars = 32
    # eval / checkpoints / budget
    c.eval.every = 10
    c.eval.num_prompts = EVAL_PROMPTS
    c.eval.samples_per_prompt = EVAL_SAMPLES
    c.eval.align_actor_updates = True       # evaluations at equal actor updates in every arm
    c.checkpoint.every = 10
    c.run.steps = steps + planned_budget(c, steps)["critic_only_steps"]   # equal actor updates
    c.run.progress = False
    c.run.tensorboard = False
    if max(c.learner.length_buckets) < c.rollout.max_len:
        raise ValueError(f"{name}: length buckets below rollout.max_len")
    if c.rollout.group_size > 1 and BATCH % c.rollout.group_size:
        raise ValueError(f"{name}: batch {BATCH} is not whole groups of {c.rollout.group_size}")
    return c
