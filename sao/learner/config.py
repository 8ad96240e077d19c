"""`LearnerConfig`: every learner knob, validated once at the boundary.

Kernels in `sao.algo` take explicit scalars; the learner reads this frozen
dataclass and passes them on. Build it from an ``ml_collections.ConfigDict``
with `LearnerConfig.from_config` (an unknown or misspelt key is an error, a
missing key keeps its default). Defaults follow docs/algorithm.md (SAO, math/tool
band); fields marked **[ours]** are project choices.

These defaults are the only ones: the experiment config's ``learner`` and
``critic`` groups are made from them (`experiment_groups`), and experiments
state what differs.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import ml_collections
from ml_collections import config_dict

from sao.models.value import ATTENTION_PARAMS_REGEX

TRUNCATION_POLICIES = ("terminal", "drop")
SCHEDULES = ("constant", "cosine", "linear")
ADVANTAGE_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "given")
SHARD_CHECK_MODES = ("off", "warn", "raise")
# Fields in the experiment config's ``critic`` group; the rest are in ``learner``,
# except those derived from other groups (``rollout.temperature``, the run's ``seed``).
CRITIC_FIELDS = ("critic_steps", "critic_warmup_steps", "lam_critic", "value_clip",
                 "critic_freeze_regex", "critic_lr", "critic_schedule", "value_pretrain_ev",
                 "value_pretrain_steps")
DERIVED_FIELDS = ("temperature", "seed")
_SCALAR_TYPES = {"float": float, "int": int, "str": str, "bool": bool}


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Learner hyper-parameters (docs/algorithm.md §3-§7).

    Attributes are grouped by subsystem; each comment gives units and source.
    """

    # --- batch shapes -----------------------------------------------------
    # B trajectories per learner step (paper 128); missing rows are zero-weight padding.
    batch_size: int = 8
    # Allowed padded lengths T (tokens); a step compiles once per bucket.
    length_buckets: tuple[int, ...] = (128, 256, 512, 1024)
    # Rows per gradient-accumulation micro-batch; 0 = the whole batch at once.
    micro_batch_size: int = 0
    pad_id: int = 256                   # token id written into padding (byte tokenizer <pad>)

    # --- advantages (§3) --------------------------------------------------
    # "gae": SAO / VAPO, critic + skip-observation GAE. Critic-free baselines:
    # "grpo" | "dr_grpo" | "rloo" (groups = prompt_id), "reinforce_pp", or
    # "given" (per-row advantages passed to Learner.update, e.g. a running mean).
    advantage_estimator: str = "gae"
    gamma: float = 1.0                  # discount per action-token step [ours: paper silent]
    alpha: float = 1.5                  # length-adaptive λ_policy = 1 - 1/(alpha*l), VAPO
    lam_policy: float | None = None     # fixed actor λ in [0, 1]; None = length-adaptive (alpha)
    lam_critic: float = 1.0             # λ of critic targets (1 = Monte-Carlo returns)
    whiten_advantages: bool = False     # batch whitening over action tokens [ours: off]
    # finish="length": "terminal" (V=0 after it, env reward) or "drop" (no policy loss) [ours].
    truncation: str = "terminal"

    # --- policy loss (§4) -------------------------------------------------
    policy_loss: str = "sao_dis"        # sao.algo registry name: "sao_dis", "ppo_clip", ...
    eps_low: float = 0.3                # band lower edge 1 - eps_low (math 0.3, coding 0.8, PPO 0.2)
    eps_high: float = 5.0               # band upper edge 1 + eps_high (math 5.0, coding 3.0, PPO 0.28)
    loss_agg_mode: str = "token-mean"   # sao.algo.aggregate mode, global-batch normaliser
    temperature: float = 1.0            # rollout temperature; log π_θ uses logits / temperature
    kl_coef: float = 0.0                # weight of KL(π_θ || π_ref) in the actor loss; 0 = off (SAO)
    kl_estimator: str = "k3"            # "k1" | "k2" | "k3"
    entropy_coef: float = 0.0           # weight of an entropy bonus; 0 = off (SAO)

    # --- critic (§5) ------------------------------------------------------
    critic_steps: int = 2               # K critic updates per policy update (paper 2)
    critic_warmup_steps: int = 10       # first N learner steps update only the critic (paper 10)
    value_clip: float = 0.0             # PPO-style value clipping range; 0 = off
    # Critic parameters whose '/'-joined path matches are frozen (paper: attention).
    critic_freeze_regex: str = ATTENTION_PARAMS_REGEX
    value_pretrain_ev: float = 0.8      # value pretraining stops at this explained variance
    value_pretrain_steps: int = 100     # ... or after this many critic steps

    # --- optimisers (AdamW, one per actor and critic) ------------------------
    actor_lr: float = 1e-6              # peak learning rate of the actor (paper 1e-6)
    critic_lr: float = 5e-6             # peak learning rate of the critic (paper 5e-6)
    actor_schedule: str = "constant"    # "constant" | "cosine" | "linear" (to 0 over lr_decay_steps)
    critic_schedule: str = "constant"   # same choices for the critic
    lr_warmup_steps: int = 0            # linear LR warm-up, in optimiser updates
    lr_decay_steps: int = 1000          # cosine / linear decay length after warm-up, in updates
    max_grad_norm: float = 1.0          # clip by global norm over trainable params; 0 = off
    weight_decay: float = 0.0           # decoupled decay (never on norms, biases, embeddings)
    adam_b1: float = 0.9                # Adam β1
    adam_b2: float = 0.999              # Adam β2
    adam_eps: float = 1e-8              # Adam ε
    actor_freeze_regex: str = ""        # actor params matching are frozen; "" = none

    # --- guards & determinism ----------------------------------------------
    # Large parameters (>= shard_check_min_size elements) left replicated on a
    # multi-device mesh: "off" | "warn" | "raise".
    shard_check: str = "warn"
    shard_check_min_size: int = 2 ** 20
    # Require bit-reproducible steps; on GPU the Learner refuses to start unless
    # XLA_FLAGS has --xla_gpu_deterministic_ops=true.
    deterministic: bool = False
    seed: int = 0                       # run seed, recorded (the update draws no random numbers)

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise ValueError(f"LearnerConfig: {msg}")

        need(self.batch_size > 0, f"batch_size must be > 0, got {self.batch_size}")
        need(len(self.length_buckets) > 0 and all(int(b) > 1 for b in self.length_buckets),
             f"length_buckets must be non-empty lengths > 1, got {self.length_buckets}")
        object.__setattr__(self, "length_buckets",
                           tuple(sorted(int(b) for b in self.length_buckets)))
        need(self.micro_batch_size >= 0, "micro_batch_size must be >= 0")
        if self.micro_batch_size:
            need(self.batch_size % self.micro_batch_size == 0,
                 f"micro_batch_size {self.micro_batch_size} must divide batch_size {self.batch_size}")
        need(self.advantage_estimator in ADVANTAGE_ESTIMATORS,
             f"advantage_estimator must be one of {ADVANTAGE_ESTIMATORS}")
        need(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        need(self.alpha > 0, f"alpha must be > 0, got {self.alpha}")
        need(self.lam_policy is None or 0.0 <= self.lam_policy <= 1.0,
             f"lam_policy must be None (length-adaptive) or in [0, 1], got {self.lam_policy}")
        need(0.0 <= self.lam_critic <= 1.0, f"lam_critic must be in [0, 1], got {self.lam_critic}")
        need(self.truncation in TRUNCATION_POLICIES,
             f"truncation must be one of {TRUNCATION_POLICIES}, got {self.truncation!r}")
        need(0.0 < self.eps_low <= 1.0, f"eps_low must be in (0, 1], got {self.eps_low}")
        need(self.eps_high > 0.0, f"eps_high must be > 0, got {self.eps_high}")
        need(self.temperature > 0.0, f"temperature must be > 0, got {self.temperature}")
        need(self.kl_coef >= 0.0 and self.entropy_coef >= 0.0, "kl_coef and entropy_coef must be >= 0")
        need(self.kl_estimator in ("k1", "k2", "k3"), f"kl_estimator must be k1|k2|k3, got {self.kl_estimator!r}")
        need(self.critic_steps >= 0, "critic_steps must be >= 0")
        need(self.critic_warmup_steps >= 0, "critic_warmup_steps must be >= 0")
        need(self.value_clip >= 0.0, "value_clip must be >= 0 (0 = off)")
        need(self.value_pretrain_steps >= 0, "value_pretrain_steps must be >= 0")
        for name in ("actor_lr", "critic_lr"):
            need(getattr(self, name) >= 0.0, f"{name} must be >= 0")
        for name in ("actor_schedule", "critic_schedule"):
            need(getattr(self, name) in SCHEDULES, f"{name} must be one of {SCHEDULES}")
        need(self.lr_warmup_steps >= 0 and self.lr_decay_steps > 0,
             "lr_warmup_steps must be >= 0 and lr_decay_steps > 0")
        need(self.max_grad_norm >= 0.0, "max_grad_norm must be >= 0 (0 = off)")
        need(self.weight_decay >= 0.0, "weight_decay must be >= 0")
        need(self.shard_check in SHARD_CHECK_MODES, f"shard_check must be one of {SHARD_CHECK_MODES}")
        if self.advantage_estimator == "gae":
            need(self.critic_steps > 0 or self.critic_warmup_steps == 0,
                 "critic warm-up needs critic_steps > 0")
        for name in ("critic_freeze_regex", "actor_freeze_regex"):
            try:
                re.compile(getattr(self, name))
            except re.error as e:
                raise ValueError(f"LearnerConfig: {name} is not a valid regex: {e}") from e

    @property
    def uses_critic(self) -> bool:
        """True when advantages come from the critic (GAE)."""
        return self.advantage_estimator == "gae"

    @classmethod
    def from_config(cls, cd: Mapping[str, Any] | Any) -> "LearnerConfig":
        """Builds and validates from an ``ml_collections.ConfigDict`` (or dict).

        Raises:
          ValueError: an unknown key (listing the valid ones) or an invalid value.
        """
        items = dict(cd.items()) if hasattr(cd, "items") else dict(cd)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(items) - names)
        if unknown:
            raise ValueError(f"LearnerConfig: unknown keys {unknown}; valid keys: {sorted(names)}")
        if "length_buckets" in items:
            items["length_buckets"] = tuple(items["length_buckets"])
        return cls(**items)

    def replace(self, **changes: Any) -> "LearnerConfig":
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


def experiment_groups() -> tuple[ml_collections.ConfigDict, ml_collections.ConfigDict]:
    """``(learner, critic)``: `LearnerConfig`'s defaults as the experiment config's two groups.

    ``critic`` holds `CRITIC_FIELDS`, ``learner`` every other field but
    `DERIVED_FIELDS`; a field whose default is None becomes a typed
    placeholder (overridable from the command line). ``sao.components.learner_config``
    merges the groups back.
    """
    defaults = LearnerConfig()
    learner, critic = ml_collections.ConfigDict(), ml_collections.ConfigDict()
    for f in dataclasses.fields(LearnerConfig):
        if f.name in DERIVED_FIELDS:
            continue
        value = getattr(defaults, f.name)
        if value is None:  # "float | None" -> a float placeholder
            value = config_dict.placeholder(_SCALAR_TYPES[str(f.type).split("|")[0].strip()])
        (critic if f.name in CRITIC_FIELDS else learner)[f.name] = value
    return learner, critic
