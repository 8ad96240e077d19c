"""In-process rollout workers: a worker on its own asyncio loop in a thread.

For single-machine runs, tests and benchmarks: the learner talks to it over
real gRPC on 127.0.0.1, exactly as to a remote worker. Use as a context
manager or call ``stop()``; ``call(coro_fn)`` runs a coroutine on the
worker's loop (e.g. to inspect the engine).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Awaitable, Callable

from sao.fleet.worker import EpisodeFn, WorkerConfig, serve
from sao.rollout.base import Engine


class ThreadedWorker:
    """Starts ``serve(engine, episode_fn, config)`` on a new thread's loop.

    ``make`` is called on the worker's loop and returns ``(engine,
    episode_fn)`` (engines may bind asyncio objects to their loop). Raises
    whatever ``make`` or ``serve`` raised, or TimeoutError after ``start_timeout``.
    """

    def __init__(self, make: Callable[[], tuple[Engine, EpisodeFn]],
                 config: WorkerConfig = WorkerConfig(), *, start_timeout: float = 30.0,
                 **serve_kwargs):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="rollout-worker")
        self._thread.start()

        async def boot():
            engine, episode_fn = make()
            return engine, await serve(engine, episode_fn, config, **serve_kwargs)

        try:
            self.engine, self.server = self._run(boot(), start_timeout)
        except BaseException:
            self._shutdown_loop()
            raise
        self.address = self.server.address

    def _run(self, coro: Awaitable, timeout: float | None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, coro_fn: Callable[[], Awaitable], timeout: float | None = 30.0):
        """Runs ``coro_fn()`` on the worker's loop and returns its result."""
        return self._run(coro_fn(), timeout)

    def _shutdown_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()

    def stop(self, grace: float | None = 0.5) -> None:
        """Stops the server (idempotent) and the loop thread."""
        if self.loop.is_closed():
            return
        try:
            self._run(self.server.stop(grace), 10 + (grace or 0))
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self._shutdown_loop()

    def __enter__(self) -> "ThreadedWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
