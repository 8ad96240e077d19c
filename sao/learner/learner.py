"""`Learner`: actor and critic train states on one mesh, and their jitted steps.

The `Learner` object holds what is static (config, mesh, model structure,
optimisers, compiled steps); the arrays live in a `LearnerStates` pytree that
is passed in and returned, so checkpointing is ``Checkpointer.save(...,
train_state=states)``. Every jitted step has explicit in/out shardings and
donates the state it replaces: after ``states, m = learner.update(states,
batch)`` the old ``states`` must not be used again.

What an update does with the compiled steps (targets, K critic steps, warm-up,
the actor step) is in `sao.learner.update`; `Learner.update` and
`Learner.value_pretrain` hand it the config and the compiled steps.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from sao.learner import steps
from sao.learner.batch import TrainBatch
from sao.learner.config import LearnerConfig
from sao.learner.guards import check_sharded
from sao.learner.mesh import batch_sharding, host_scalar, put_batch
from sao.learner.state import LearnerStates, make_optimizer, plan_state, trainable_mask
from sao.learner.update import CompiledSteps, update_step, value_pretrain
from sao.models import ValueModel

ModelOrFactory = nnx.Module | Callable[[], nnx.Module]
GPU_DETERMINISM_FLAG = "--xla_gpu_deterministic_ops=true"


def check_determinism(deterministic: bool, mesh: Mesh, env=None) -> None:
    """With ``deterministic``, GPU meshes need ``GPU_DETERMINISM_FLAG`` in
    ``XLA_FLAGS`` (set before JAX starts); CPU and TPU steps are already
    reproducible (no randomness in the update, fixed micro-batch order).

    Raises:
      ValueError: a GPU mesh without the flag.
    """
    env = os.environ if env is None else env
    platforms = {d.platform for d in mesh.devices.flat}
    if deterministic and platforms & {"gpu", "cuda", "rocm"}:
        if GPU_DETERMINISM_FLAG not in env.get("XLA_FLAGS", ""):
            raise ValueError(f"deterministic=True on GPU needs XLA_FLAGS={GPU_DETERMINISM_FLAG} "
                             "before JAX starts (or set deterministic=False)")


class Learner:
    """Builds sharded states and compiled steps for one `LearnerConfig`.

    Args:
      cfg: validated learner config.
      mesh: the learner mesh (`sao.learner.mesh.mesh_from_config`).
      policy: a ``sao.models.Transformer`` or a factory returning one (a
        factory materialises parameters directly with their sharding).
      critic: a ``ValueModel`` / factory; default ``ValueModel.from_policy``
        of the policy when ``cfg.uses_critic`` (None otherwise).
    Raises:
      ValueError: ``cfg.batch_size`` not divisible by the micro-batch size, or
        (``shard_check="raise"``) large parameters left replicated.
    """

    def __init__(self, cfg: LearnerConfig, mesh: Mesh, policy: ModelOrFactory,
                 critic: ModelOrFactory | None = None):
        self.cfg, self.mesh = cfg, mesh
        check_determinism(cfg.deterministic, mesh)
        self.num_micro = cfg.batch_size // cfg.micro_batch_size if cfg.micro_batch_size else 1
        self._rep = NamedSharding(mesh, PartitionSpec())
        self._bs = batch_sharding(mesh, (cfg.batch_size,))

        self._actor_plan = plan_state(policy, functools.partial(
            make_optimizer, lr=cfg.actor_lr, freeze_regex=cfg.actor_freeze_regex,
            **self._opt_kwargs(cfg.actor_schedule)), mesh)
        self.actor_def = self._actor_plan.model_def
        self.actor_shardings, self.actor_tx = self._actor_plan.shardings, self._actor_plan.tx
        self._critic_plan = None
        self.critic_def = self.critic_tx = self.critic_shardings = None
        if cfg.uses_critic:
            if critic is None:
                critic = (ValueModel.from_policy(policy) if isinstance(policy, nnx.Module)
                          else (lambda: ValueModel.from_policy(policy())))
            self._critic_plan = plan_state(critic, functools.partial(
                make_optimizer, lr=cfg.critic_lr, freeze_regex=cfg.critic_freeze_regex,
                **self._opt_kwargs(cfg.critic_schedule)), mesh)
            self.critic_def = self._critic_plan.model_def
            self.critic_shardings = self._critic_plan.shardings
            self.critic_tx = self._critic_plan.tx
        self.state_shardings = LearnerStates(
            actor=self.actor_shardings, critic=self.critic_shardings,
            ref_params=self.actor_shardings.params if cfg.kl_coef > 0 else None, step=self._rep)
        self._build_steps()

    def _opt_kwargs(self, schedule: str) -> dict:
        c = self.cfg
        return dict(schedule=schedule, warmup_steps=c.lr_warmup_steps,
                    decay_steps=c.lr_decay_steps, max_grad_norm=c.max_grad_norm,
                    weight_decay=c.weight_decay, b1=c.adam_b1, b2=c.adam_b2, eps=c.adam_eps)

    def _build_steps(self):
        c, bs, rep = self.cfg, self._bs, self._rep
        actor_trainable = trainable_mask(self.actor_shardings.params, c.actor_freeze_regex)
        hp = {"eps_low": c.eps_low, "eps_high": c.eps_high}
        actor_step = jax.jit(
            functools.partial(
                steps.actor_step, model_def=self.actor_def, tx=self.actor_tx,
                trainable=actor_trainable, num_micro=self.num_micro, policy_loss=c.policy_loss,
                hparams=hp, agg_mode=c.loss_agg_mode, temperature=c.temperature,
                kl_coef=c.kl_coef, kl_estimator=c.kl_estimator, entropy_coef=c.entropy_coef),
            in_shardings=(self.actor_shardings, self.state_shardings.ref_params, bs),
            out_shardings=(self.actor_shardings, rep), donate_argnums=0)
        self._actor_logprobs = jax.jit(
            functools.partial(steps.actor_logprobs, self.actor_def, temperature=c.temperature),
            in_shardings=(self.actor_shardings.params, bs), out_shardings=bs)
        critic_step = critic_values = None
        if self.critic_def is not None:
            critic_trainable = trainable_mask(self.critic_shardings.params, c.critic_freeze_regex)
            critic_step = jax.jit(
                functools.partial(steps.critic_step, model_def=self.critic_def,
                                  tx=self.critic_tx, trainable=critic_trainable,
                                  num_micro=self.num_micro, value_clip=c.value_clip),
                in_shardings=(self.critic_shardings, bs),
                out_shardings=(self.critic_shardings, rep), donate_argnums=0)
            critic_values = jax.jit(
                functools.partial(steps.critic_values, self.critic_def),
                in_shardings=(self.critic_shardings.params, bs), out_shardings=bs)
        self._steps = CompiledSteps(mesh=self.mesh, actor_step=actor_step,
                                    critic_step=critic_step, critic_values=critic_values)

    # -- states ------------------------------------------------------------

    def init_states(self) -> LearnerStates:
        """Fresh sharded states (same bits on every call), checked with
        `check_sharded`; the reference policy is a copy of the initial actor.

        Raises:
          ValueError: ``shard_check="raise"`` and a large parameter is replicated.
        """
        actor = self._actor_plan.init()
        critic = self._critic_plan.init() if self._critic_plan is not None else None
        for name, state in (("actor", actor), ("critic", critic)):
            if state is not None:
                check_sharded(state.params, self.mesh, min_size=self.cfg.shard_check_min_size,
                              mode=self.cfg.shard_check, name=name)
        ref = None
        if self.cfg.kl_coef > 0:
            ref = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                          out_shardings=self.actor_shardings.params)(actor.params)
        step = host_scalar(0, jnp.int32, self._rep)
        return LearnerStates(actor=actor, critic=critic, ref_params=ref, step=step)

    def abstract_states(self, like: LearnerStates | None = None) -> LearnerStates:
        """Shape/dtype/sharding tree of the states on this learner's mesh (of
        ``like`` if given, else computed with ``jax.eval_shape``, nothing
        materialised): the restore target for ``sao.ckpt.Checkpointer.restore``."""
        if like is None:
            actor = jax.eval_shape(self._actor_plan.init)
            critic = jax.eval_shape(self._critic_plan.init) if self._critic_plan else None
            like = LearnerStates(actor=actor, critic=critic,
                                 ref_params=actor.params if self.cfg.kl_coef > 0 else None,
                                 step=jax.ShapeDtypeStruct((), jnp.int32))
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            like, self.state_shardings)

    def put_batch(self, batch: TrainBatch) -> TrainBatch:
        """Places a host `TrainBatch` on the mesh (rows sharded).

        Raises:
          ValueError: the batch has another B than ``cfg.batch_size``.
        """
        return put_batch(batch, self.mesh, self.cfg.batch_size)

    # -- single steps (mesh-aware wrappers) -----------------------------------

    def critic_values(self, states: LearnerStates, tokens) -> jax.Array:
        """Critic values f32[B, T] for tokens i32[B, T]."""
        with jax.set_mesh(self.mesh):
            return self._steps.critic_values(states.critic.params,
                                             jax.device_put(tokens, self._bs))

    def actor_logprobs(self, states: LearnerStates, tokens) -> jax.Array:
        """Policy log-probs f32[B, T] at ``cfg.temperature``."""
        with jax.set_mesh(self.mesh):
            return self._actor_logprobs(states.actor.params, jax.device_put(tokens, self._bs))

    def compiled_sizes(self) -> dict[str, int]:
        """Number of compiled variants per jitted step (recompile guard)."""
        fns = {"actor_step": self._steps.actor_step, "actor_logprobs": self._actor_logprobs}
        if self.critic_def is not None:
            fns.update(critic_step=self._steps.critic_step,
                       critic_values=self._steps.critic_values)
        return {k: f._cache_size() for k, f in fns.items()}

    # -- algorithm ----------------------------------------------------------

    def update(self, states: LearnerStates, batch: TrainBatch,
               seq_advantages=None) -> tuple[LearnerStates, dict[str, float]]:
        """One learner step on one batch: the SAO update with a critic
        (``advantage_estimator="gae"``), else the critic-free one of the
        configured estimator (GRPO, Dr. GRPO, RLOO, REINFORCE++, ``given``).
        Donates ``states``. See `sao.learner.update.update_step` (arguments,
        metrics, errors)."""
        return update_step(self.cfg, self._steps, states, batch, seq_advantages)

    def value_pretrain(self, states: LearnerStates, batches, *, ev_threshold: float | None = None,
                       max_steps: int | None = None) -> tuple[LearnerStates, dict]:
        """Fits the critic before RL; donates ``states``. See
        `sao.learner.update.value_pretrain`."""
        return value_pretrain(self.cfg, self._steps, states, batches,
                              ev_threshold=ev_threshold, max_steps=max_steps)
