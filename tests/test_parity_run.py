"""A run (``sao.train.train``, the learner's phases) whose rollout servers all
disagree with the learner stops at the start of RL with the parity gate's
error naming the likely causes, before a single step trains on their tokens.

The servers are real gRPC workers built as ``sao.workers.serve`` builds them,
except that their model has rope theta 1e6 where the learner's has 1e4 (a
server launched with the wrong rope settings). The quick start's model is a
random init here (no SFT): near uniform, so the threshold is lowered to 0.01
nats (a matched server differs by ~1e-6; the quick start's own run,
tests/test_main.py, passes the default). The matched case end to end is
tests/test_main.py (its records carry ``parity/...``).
"""
import os

import pytest
from flax import nnx

from sao import components, train, workers
from sao.analysis import experiment_config
from sao.fleet.dispatch_config import FleetError
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig, agent_episode_fn
from sao.models import Transformer, get_preset
from sao.rollout.jax_engine import JaxEngine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = ["sft.steps=0", "learner.batch_size=8", "train.value_pretrain_trajectories=0",
             "eval.num_prompts=2", "env.task_size=200", "data.heldout_fraction=0.2",
             "rollout.max_concurrency=8", "rollout.engine_slots=8", "run.steps=2",
             "run.progress=False", "run.tensorboard=False", "run.batch_timeout_s=300",
             "rollout.parity.max_mean_gap=0.01",
             "model.mesh.data=-1"]                 # the 8 devices tests/conftest.py makes

pytestmark = pytest.mark.slow  # the learner's components, an evaluation, two workers (~1 min)


def rope_worker(cfg, workdir: str, index: int) -> ThreadedWorker:
    """A rollout worker as ``sao.workers.serve`` makes it, its model with another rope theta."""
    tokenizer = components.make_tokenizer(cfg)

    def make():
        wrong = get_preset(cfg.model.preset, rope_theta=1e6)
        engine = JaxEngine(Transformer(wrong, rngs=nnx.Rngs(index)), max_slots=8,
                           max_len=cfg.rollout.max_len, version=components.NO_WEIGHTS_VERSION)
        make_env = components.make_env_factory(cfg, components.make_tasks(cfg))
        return engine, agent_episode_fn(engine, make_env, tokenizer,
                                        components.sampling_params(cfg, tokenizer),
                                        **components.episode_kwargs(cfg, tokenizer))
    return ThreadedWorker(make, WorkerConfig(max_concurrency=8,
                                             security=workers.fleet_security(cfg, workdir),
                                             publish_root=workers.publish_root(cfg, workdir)),
                          start_timeout=300)  # tasks and model built on a busy machine


def test_a_run_whose_servers_all_disagree_stops_naming_the_causes(tmp_path):
    cfg = experiment_config(os.path.join(ROOT, "experiments", "quickstart.py"), OVERRIDES)
    workdir = str(tmp_path / "run")
    workers.fleet_security(cfg, workdir, create=True)         # the learner's token file, first
    with rope_worker(cfg, workdir, 1) as a, rope_worker(cfg, workdir, 2) as b:
        with pytest.raises(FleetError) as err:
            train.train(cfg, workdir, addresses=[a.address, b.address])
    message = str(err.value)
    assert "no usable worker" in message and a.address in message and b.address in message
    assert "log-probs differ from the learner's at version 0" in message
    for cause in ("tokenizer or chat template", "dtype", "rope settings",
                  "weights not loaded or half loaded"):
        assert cause in message
    assert not os.path.exists(os.path.join(workdir, "ckpt", "1"))  # no step trained
