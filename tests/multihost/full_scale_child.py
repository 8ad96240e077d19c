"""Child of test_full_scale_meshes.py: one process with N fake CPU devices (the
launchers' device count) builds each full-scale variant's mesh from its config
and runs one SAO update with a scaled-down preset. Prints one JSON line per variant."""
import json
import os
import sys

N = int(sys.argv[1])
os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from xla_flags import FAST_COMPILE, cpu_devices  # noqa: E402

os.environ["XLA_FLAGS"] = f"{cpu_devices(N)} {FAST_COMPILE}"   # one update per variant: compiling

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import common, sao_math  # noqa: E402
from sao import components  # noqa: E402
from sao.learner.batch import make_train_batch  # noqa: E402
from sao.learner.learner import Learner  # noqa: E402
from sao.learner.mesh import mesh_from_config  # noqa: E402
from sao.types import Trajectory  # noqa: E402

SMALL = {"qwen3-30b-a3b": "tiny-moe"}          # MoE stays MoE (4 routed experts)


def trajectories(n, rng):
    out = []
    for i in range(n):
        length = int(rng.integers(12, 32))
        mask = np.zeros(length, bool)
        mask[6:] = True
        out.append(Trajectory(tokens=rng.integers(0, 256, length), action_mask=mask,
                              rollout_logprobs=np.where(mask, -5.0, 0.0).astype(np.float32),
                              policy_version=np.zeros(length, np.int32), reward=float(i % 2),
                              finish="stop", prompt_id=f"p{i}", trajectory_id=f"t{i}"))
    return out


for variant in sys.argv[2:]:
    cfg = sao_math.get_config(variant)
    cfg.unlock()
    cfg.model.preset = SMALL.get(cfg.model.preset, "tiny")
    cfg.model.init = ""
    cfg.model.param_dtype = cfg.model.dtype = "float32"
    cfg.learner.length_buckets = (32,)
    cfg.learner.micro_batch_size = 0
    cfg.critic.critic_warmup_steps = 0          # the update moves the actor too
    mesh = mesh_from_config(cfg.model.mesh)     # the variant's own mesh config, all N devices
    batch_rows = mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]
    cfg.learner.batch_size = batch_rows
    policy = components.make_policy(cfg, cfg.seed, mesh=mesh)
    learner = Learner(components.learner_config(cfg), mesh, policy)
    states = learner.init_states()
    before = np.asarray(jax.device_get(states.actor.params["embed"]["embedding"]))
    batch = make_train_batch(trajectories(batch_rows, np.random.default_rng(0)), buckets=(32,),
                             batch_size=batch_rows, pad_id=cfg.learner.pad_id)
    states, metrics = learner.update(states, batch)
    after = np.asarray(jax.device_get(states.actor.params["embed"]["embedding"]))
    emb = states.actor.params["embed"]["embedding"]
    print(json.dumps({"variant": variant, "mesh": dict(mesh.shape), "devices": len(jax.devices()),
                      "embed_spec": str(emb.sharding.spec),
                      "policy_version": states.policy_version,
                      "actor_moved": bool(np.any(before != after)),
                      "finite": all(np.isfinite(v) for v in metrics.values())}), flush=True)
