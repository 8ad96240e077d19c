"""A run's checkpoints, the learner of its config, and trajectories to look at.

A run directory (``python -m sao.main --workdir=RUN_DIR``) keeps the learner's
train states in ``ckpt/`` (one orbax step per checkpointed learner step, the
newest ``checkpoint.keep``; docs/learner.md) but not the trajectories it
trained on. `CheckpointedRun` rebuilds the learner from the run's config,
restores any kept step and gives two kinds of trajectories:

* `CheckpointedRun.buffered`: the fleet's trajectories that a checkpoint
  holds in the dispatcher's state (received, not yet trained); real rollouts
  with their engines' log-probs and versions, but there may be none;
* `CheckpointedRun.sample`: fresh episodes of training prompts, sampled by the
  policy of a given checkpoint with the run's engine, environment and tool
  sandbox. Sampled by an older checkpoint than the one that scores them, they
  are stale by the difference of versions, as fleet trajectories are.

A run records its resolved config in ``config.json`` (`run_config`); for a
run without one, pass the same experiment file and overrides as the run
(`experiment_config`).
"""
from __future__ import annotations

import base64
import os
import random
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from absl import flags
from ml_collections import config_flags

from sao import ckpt, components, run_metrics, train
from sao.evaluation import Sampler
from sao.learner import Learner, mesh_from_config
from sao.rpc import codec
from sao.types import Trajectory


def experiment_config(spec: str, overrides: Sequence[str] = ()):
    """The config ``python -m sao.main --config=SPEC OVERRIDES...`` runs with.

    Args:
      spec: ``path/to/experiments/<file>.py[:variant]``; the directory above
        ``experiments/`` goes on ``sys.path`` (experiment files import
        ``experiments.common``).
      overrides: ``--config.a.b=value`` flags (the ``--config.`` prefix may be omitted).
    Returns:
      the locked ``ml_collections.ConfigDict``.
    Raises:
      FileNotFoundError: no such experiment file; flags errors on a bad override.
    """
    file, _, variant = spec.partition(":")
    path = os.path.abspath(file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no experiment file {path}")
    root = os.path.dirname(os.path.dirname(path))
    if root not in sys.path:
        sys.path.insert(0, root)
    argv = ["experiment_config", f"--config={path}" + (f":{variant}" if variant else ""),
            *(o if o.startswith("--") else f"--config.{o}" for o in overrides)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "experiment", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    values(argv)
    return values.config


def run_config(run_dir: str):
    """The locked config a run recorded in ``<run_dir>/config.json`` (``sao.train``
    writes it when the run starts; ``sao.run_metrics.config_from_dict``).

    Raises:
      FileNotFoundError: the run has no ``config.json`` (it predates the file:
        use `experiment_config` with the run's flags).
    """
    data = train.read_json(os.path.join(run_dir, run_metrics.CONFIG_FILE))
    if data is None:
        raise FileNotFoundError(f"{run_dir} has no {run_metrics.CONFIG_FILE}: pass the run's "
                                "experiment file and overrides to experiment_config")
    return run_metrics.config_from_dict(data)


class CheckpointedRun:
    """The checkpoints of one run, with the learner and tokenizer of its config.

    Args:
      cfg: the run's experiment config (`experiment_config`); None: the one the
        run recorded (`run_config`).
      run_dir: the run's ``--workdir``.
    Attributes:
      cfg, run_dir, tokenizer, policy (the module the sampling engine runs),
      learner (a ``sao.learner.Learner`` on ``cfg.model.mesh``).
    Raises:
      FileNotFoundError: ``run_dir`` has no ``ckpt/`` directory, or ``cfg`` is
        None and it has no ``config.json``.
    """

    def __init__(self, cfg, run_dir: str):
        directory = os.path.join(run_dir, "ckpt")
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"{run_dir} has no ckpt/ directory (not a run, or no "
                                    "checkpoint yet)")
        cfg = run_config(run_dir) if cfg is None else cfg
        self.cfg, self.run_dir = cfg, run_dir
        self.tokenizer = components.make_tokenizer(cfg)
        self.policy = components.make_policy(cfg, cfg.seed)
        self.learner = Learner(components.learner_config(cfg), mesh_from_config(cfg.model.mesh),
                               self.policy)
        self._checkpointer = ckpt.Checkpointer(directory, async_save=False)

    def steps(self) -> list[int]:
        """Kept checkpoint steps (learner steps), oldest first."""
        return sorted(self._checkpointer.all_steps())

    def restore(self, step: int | None = None) -> ckpt.Restored:
        """Checkpoint ``step`` (default the newest): ``train_state`` is the
        ``LearnerStates``, ``policy_version`` its version.

        Raises:
          FileNotFoundError: no complete checkpoint; ValueError: ``step`` not kept.
        """
        if step is not None and step not in self.steps():
            raise ValueError(f"step {step} not among the kept checkpoints {self.steps()}")
        return self._checkpointer.restore(step, target=self.learner.abstract_states())

    @staticmethod
    def buffered(restored: ckpt.Restored) -> list[Trajectory]:
        """The fleet's trajectories buffered in a checkpoint's dispatcher state
        (``data_state["dispatcher"]["buffer"]``), in arrival order; ``[]`` if none.

        Raises:
          sao.rpc.codec.CodecError: a buffered trajectory does not decode.
        """
        state = (restored.data_state or {}).get("dispatcher") or {}
        return list(restored.buffer) + [codec.decode(base64.b64decode(b))
                                        for b in state.get("buffer", [])]

    def sample(self, states, n: int, *, seed: int = 0) -> list[Trajectory]:
        """``n`` episodes of training prompts (drawn with ``seed``) by the policy of
        ``states`` (a restored ``train_state``), one per prompt, at the rollout
        temperature; their tokens carry ``states.policy_version``.

        Runs in its own thread, so it also works inside Jupyter's event loop.
        Raises ValueError if ``n`` is not in ``[1, number of training prompts]``.
        """
        cfg, tok = self.cfg, self.tokenizer
        tasks = components.make_tasks(cfg)
        records, _ = components.split_prompts(cfg, tasks)
        if not 1 <= n <= len(records):
            raise ValueError(f"n must be in [1, {len(records)}], got {n}")
        engine = components.make_engine(cfg, seed=seed, model=self.policy)
        sampler = Sampler(engine, components.make_env_factory(
                              cfg, tasks, clock=components.engine_clock(lambda: engine)),
                          tok, components.sampling_params(cfg, tok),
                          param_state=lambda s: self.learner.actor_def.param_state(s.actor.params),
                          concurrency=cfg.rollout.max_concurrency,
                          **components.episode_kwargs(cfg, tok))
        prompts = random.Random(seed).sample(records, n)
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(sampler.sample, states, prompts).result()

    def close(self) -> None:
        self._checkpointer.close()

    def __enter__(self) -> "CheckpointedRun":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
