"""A standalone rollout worker serving the simulated engine (``sao.fleet.sim``).

    python -m sao.fleet.sim_worker --port 0 --seconds_per_token 0.001

Prints ``READY <host:port>`` on stdout once it listens; SIGTERM stops it.
Used by the fault tests (SIGKILL, restart) and for trying a fleet by hand.
The shared token comes from ``$SAO_FLEET_TOKEN`` (never from the command line).
"""
from __future__ import annotations

import argparse
import os
import sys

from sao.fleet import sim
from sao.fleet.worker import WorkerConfig, run
from sao.rpc.auth import Security


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seconds_per_token", type=float, default=0.001)
    p.add_argument("--max_concurrency", type=int, default=16)
    p.add_argument("--worker_id", default="")
    args = p.parse_args(argv)
    security = Security(token=os.environ.get("SAO_FLEET_TOKEN", ""))

    def make():
        engine = sim.SimulatedEngine(seconds_per_token=args.seconds_per_token)
        return engine, sim.make_sim_episode_fn(engine)

    def ready(address: str) -> None:
        print(f"READY {address}", flush=True)

    run(make, WorkerConfig(host=args.host, port=args.port, max_concurrency=args.max_concurrency,
                           worker_id=args.worker_id, security=security), ready=ready)


if __name__ == "__main__":
    main(sys.argv[1:])
