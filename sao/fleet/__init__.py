"""The rollout fleet: workers serving episodes over gRPC, the learner's
dispatcher with a staleness bound, weight push, faults, replay (docs/fleet.md).

Nothing here imports JAX: a worker process pays only for its engine.
"""
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig, FleetError
from sao.fleet.local import ThreadedWorker
from sao.fleet.replay import Recorder, ReplaySource, ReplayWriter, read_batches
from sao.fleet.staleness import is_stale, lag, max_in_flight
from sao.fleet.worker import WorkerConfig, WorkerServer, agent_episode_fn, run, serve

__all__ = ["Dispatcher", "DispatcherConfig", "FleetError", "Recorder", "ReplaySource", "ReplayWriter",
           "ThreadedWorker", "WorkerConfig", "WorkerServer", "agent_episode_fn", "is_stale",
           "lag", "max_in_flight", "read_batches", "run", "serve"]
