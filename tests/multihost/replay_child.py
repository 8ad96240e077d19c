"""Child of test_two_processes.py: the 1-process, 8-device reference learner.

It trains on a recorded ``replay.bin`` (``run.replay``) instead of a fleet.
The process joins a one-process ``jax.distributed`` job so that its CPU
collectives are the same gloo ones as the two-process run's: gloo sums in
another order than XLA's in-process CPU collectives, so a plain one-process
run agrees with a two-process one to rounding, not bit for bit.

    python replay_child.py PORT WORKDIR REPLAY OVERRIDE...
"""
import os
import sys

port, workdir, replay, *overrides = sys.argv[1:]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)

from sao import train  # noqa: E402
from sao.analysis import experiment_config  # noqa: E402

cfg = experiment_config(os.path.join(ROOT, "experiments", "sao_math.py:cpu"),
                        [*overrides, f"run.replay={replay}", "run.record_batches=False"])
summary = train.train(cfg, workdir, addresses=[])
print("reference steps", summary["steps"], "version", summary["policy_version"], flush=True)
