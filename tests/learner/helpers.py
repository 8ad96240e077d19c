"""Shared builders for learner tests: a 1-layer d=64 model and hand-made trajectories."""
from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx

from sao.learner.config import LearnerConfig
from sao.learner.mesh import mesh_from_config
from sao.models import Transformer, get_preset
from sao.types import Trajectory

MODEL_CFG = get_preset("tiny", hidden_size=64, intermediate_size=128, num_heads=2,
                       num_kv_heads=1, num_layers=1)


def make_policy(seed: int = 0):
    """Factory for a tiny policy (parameters materialised inside jit)."""
    return lambda: Transformer(MODEL_CFG, rngs=nnx.Rngs(seed))


def one_device_mesh():
    return mesh_from_config({"data": 1}, devices=jax.devices()[:1])


# One small SAO config shared by the update and checkpoint tests, so that both
# use one `Learner` (and its compiled steps) per test session.
SHARED_CFG = LearnerConfig(batch_size=4, length_buckets=(8, 16), critic_warmup_steps=1,
                           critic_steps=2, actor_lr=1e-2, critic_lr=1e-2, eps_low=0.5,
                           eps_high=1.0, shard_check="raise", deterministic=True)


@functools.lru_cache(maxsize=None)
def shared_learner():
    from sao.learner.learner import Learner
    return Learner(SHARED_CFG, one_device_mesh(), make_policy(0))


def traj(prompt, actions, reward, *, logprob=-1.0, version=0, finish="stop", pid=None,
         obs=()):
    """prompt + action tokens (+ optional observation span then one more action)."""
    tokens = list(prompt) + list(actions)
    mask = [False] * len(prompt) + [True] * len(actions)
    if obs:
        tokens += list(obs) + [actions[-1]]
        mask += [False] * len(obs) + [True]
    mask = np.asarray(mask)
    return Trajectory(tokens=np.asarray(tokens), action_mask=mask,
                      rollout_logprobs=np.where(mask, logprob, 0.0),
                      policy_version=np.full(len(tokens), version), reward=reward,
                      finish=finish, prompt_id=pid or f"p{tokens[:len(prompt)]}",
                      trajectory_id=f"t{np.random.default_rng().integers(1 << 30)}")


def random_trajs(n, rng, *, min_len=8, max_len=30):
    out = []
    for i in range(n):
        length = int(rng.integers(min_len, max_len + 1))
        mask = np.zeros(length, bool)
        mask[4:] = True
        mask[length // 2: length // 2 + 2] = False  # an observation span
        out.append(Trajectory(tokens=rng.integers(0, 256, length), action_mask=mask,
                              rollout_logprobs=np.where(mask, -5.6, 0.0),
                              policy_version=np.zeros(length), reward=float(i % 2),
                              finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}"))
    return out
