"""Rollout worker: a gRPC server that runs episodes for the learner.

The worker wraps one ``Engine`` and an *episode function* ``async (prompt:
dict) -> Trajectory`` (``agent_episode_fn`` builds one from the agent loop and
an environment factory). On the ``Generate`` stream it starts one asyncio task
per leased prompt, runs many concurrently, and streams finished trajectories
back in completion order, packing whatever finished together into one message.
``UpdateWeights`` swaps the engine's weights while episodes run; their tokens
record the version that produced them. A lease may carry its own sampling
temperature (held-out evaluation). Episode failures travel back as error
values; an engine that gave up for good (``unusable``, e.g. weight loads that
kept failing) is reported by ``Status`` and refuses every ``UpdateWeights``,
so the learner stops pushing to it (``sao.fleet.link``). Binds 127.0.0.1
unless told otherwise, and any other address only with
a token (``sao.rpc.credentials.check_bind``). ``UpdateWeights`` loads only a
newer version within ``max_version_jump`` of the served one, from a uri under
``publish_root`` that the publish manifest there names for that version
(``sao.fleet.published``; ``weights_request_error``); a refusal is an error
value.

Entry points: ``serve(...)`` (asyncio, returns a running ``WorkerServer``) and
``run(...)`` (blocking, for ``python -m sao.main --role rollout``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import time
import uuid
from typing import Any, Awaitable, Callable

import grpc
import numpy as np

from sao.fleet.published import unpublished_error
from sao.rollout.base import Engine
from sao.rpc import auth, codec, credentials, sao_pb2, sao_pb2_grpc
from sao.types import Trajectory

# ``episode(prompt)``, and ``episode(prompt, temperature=t)`` for leases that carry one.
EpisodeFn = Callable[..., Awaitable[Trajectory]]
log = logging.getLogger(__name__)
MAX_VERSION = 2**31 - 1  # tokens carry their policy version as int32
MAX_SCORE_SEQUENCES, MAX_SCORE_TOKENS = 64, 65536  # most a Score request may ask for


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Where and how a worker serves.

    Attributes:
      host: bind address; 127.0.0.1 unless the fleet spans machines.
      port: TCP port; 0 picks a free one (read it from ``WorkerServer.port``).
      max_concurrency: episodes run at once; the dispatcher leases at most this
        many prompts to the worker.
      max_batch_bytes: most serialized trajectory bytes per response message.
      worker_id: name in metrics (default: host:port).
      security: token and TLS settings (``sao.rpc.auth.Security``); a token is
        required unless ``host`` is loopback.
      publish_root: directory the learner publishes weights under
        (``sao.ckpt.publish``); ``UpdateWeights`` refuses uris outside it and
        any ``(version, uri)`` its publish manifest does not hold
        (``sao.fleet.published``). None: any uri (in-process fleets, tests).
      max_version_jump: most versions one ``UpdateWeights`` may move ahead of
        the served version (not checked before the first learner weights, while
        the engine serves a negative version). None: no bound.
    """

    host: str = "127.0.0.1"
    port: int = 0
    max_concurrency: int = 64
    max_batch_bytes: int = 64 * 1024 * 1024
    worker_id: str = ""
    security: auth.Security = auth.Security()
    publish_root: str | None = None
    max_version_jump: int | None = 100_000

    def __post_init__(self):
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.max_batch_bytes < 1:
            raise ValueError(f"max_batch_bytes must be >= 1, got {self.max_batch_bytes}")
        if self.max_version_jump is not None and self.max_version_jump < 1:
            raise ValueError(f"max_version_jump must be >= 1, got {self.max_version_jump}")


def _under(uri: str, root: str) -> bool:
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri or not uri:
        return False
    root, path = os.path.realpath(root), os.path.realpath(uri)  # symlinks and ".." resolved
    return path != root and os.path.commonpath([root, path]) == root


def weights_request_error(version: int, uri: str, *, served: int, served_uri: str | None,
                          publish_root: str | None, max_version_jump: int | None) -> str | None:
    """Why the worker refuses ``UpdateWeights(version, uri)``, or None to load it.

    Args:
      version, uri: the request.
      served, served_uri: the version the engine serves and the uri it was
        loaded from by ``UpdateWeights`` (None before the first one).
      publish_root, max_version_jump: ``WorkerConfig`` fields.
    Refused: a version outside ``[0, 2**31 - 1]``, older than ``served``, equal
    to it from another uri (the same uri is an idempotent retry), more than
    ``max_version_jump`` ahead of a served version >= 0; a uri that is not a
    path (or ``file://`` uri) strictly under ``publish_root`` after resolving
    symlinks and ``..``; a ``(version, uri)`` the publish manifest under
    ``publish_root`` does not hold (``sao.fleet.published.unpublished_error``:
    a version never published, or one labelling another version's weights).
    """
    if not 0 <= version <= MAX_VERSION:
        return f"version {version} outside [0, {MAX_VERSION}]"
    if version < served:
        return f"version {version} is older than the served {served}"
    if version == served and uri != served_uri:
        return f"version {version} is already served (not from {uri!r})"
    if max_version_jump is not None and served >= 0 and version - served > max_version_jump:
        return (f"version {version} is more than max_version_jump={max_version_jump} "
                f"ahead of the served {served}")
    if publish_root is not None and not _under(uri, publish_root):
        return f"uri {uri!r} is not under the publish root {publish_root}"
    if publish_root is not None:
        return unpublished_error(version, uri, publish_root)
    return None


def agent_episode_fn(engine: Engine, make_env: Callable[[], Any], tokenizer, sampling,
                     **episode_kwargs) -> EpisodeFn:
    """Episode function running ``sao.rollout.run_episode`` with a fresh env
    from ``make_env()`` per prompt (``episode_kwargs``: max_turns, ...);
    ``temperature`` (a lease's, e.g. held-out evaluation) replaces the
    sampling temperature of that episode."""
    from sao.rollout.agent import run_episode

    async def episode(prompt: dict, temperature: float | None = None) -> Trajectory:
        params = sampling if temperature is None else sampling.replace(temperature=temperature)
        return await run_episode(engine, make_env(), tokenizer, prompt, params,
                                 **episode_kwargs)

    return episode


def engine_unusable(engine: Engine) -> str:
    """Why ``engine`` gave up for good (its ``unusable`` attribute, e.g.
    ``SGLangEngine`` after ``max_reload_failures`` failed loads), or ``""``."""
    return str(getattr(engine, "unusable", None) or "")


class RolloutServicer(sao_pb2_grpc.RolloutWorkerServicer):
    """The ``RolloutWorker`` service over one engine."""

    def __init__(self, engine: Engine, episode_fn: EpisodeFn, config: WorkerConfig):
        self.engine, self.episode_fn, self.config = engine, episode_fn, config
        self.worker_id = config.worker_id or uuid.uuid4().hex[:8]
        self.active = 0
        self.completed = 0
        self.failed = 0
        self.generated_tokens = 0
        self.refused_updates = 0
        self._served_uri: str | None = None
        self._t0 = time.monotonic()
        self._gate = asyncio.Semaphore(config.max_concurrency)

    async def _episode(self, lease: sao_pb2.Lease) -> sao_pb2.Finished:
        async with self._gate:
            self.active += 1
            try:
                prompt = json.loads(lease.prompt_json) if lease.prompt_json else {}
                prompt.setdefault("prompt_id", lease.prompt_id)
                if lease.HasField("temperature"):  # e.g. an evaluation lease
                    traj = await self.episode_fn(prompt, temperature=lease.temperature)
                else:
                    traj = await self.episode_fn(prompt)
                traj.prompt_id, traj.trajectory_id = lease.prompt_id, lease.lease_id
                data = codec.encode(traj)
                self.completed += 1
                self.generated_tokens += traj.num_action_tokens
                return sao_pb2.Finished(lease_id=lease.lease_id, trajectory=data)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the episode failed: tell the learner, keep serving
                self.failed += 1
                log.warning("episode for lease %s failed: %r", lease.lease_id, e)
                return sao_pb2.Finished(lease_id=lease.lease_id, error=f"{type(e).__name__}: {e}")
            finally:
                self.active -= 1

    async def Generate(self, request_iterator, context):
        done: asyncio.Queue = asyncio.Queue()
        tasks: dict[str, asyncio.Task] = {}

        async def run_one(lease):
            try:
                await done.put(await self._episode(lease))
            finally:
                tasks.pop(lease.lease_id, None)

        async def read():
            async for req in request_iterator:
                for lease in req.leases:
                    if lease.lease_id not in tasks:
                        tasks[lease.lease_id] = asyncio.create_task(run_one(lease))
                for lease_id in req.cancel_lease_ids:
                    task = tasks.pop(lease_id, None)
                    if task is not None:
                        task.cancel()
            # The learner closed its side: finish what runs, then end the stream.
            while tasks:
                await asyncio.gather(*list(tasks.values()), return_exceptions=True)
            await done.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                first = await done.get()
                if first is None:
                    break
                batch, size, end = [first], first.ByteSize(), False
                while not done.empty() and size < self.config.max_batch_bytes:
                    item = done.get_nowait()
                    if item is None:
                        end = True
                        break
                    batch.append(item)
                    size += item.ByteSize()
                yield sao_pb2.GenerateResponse(finished=batch, worker_version=self.engine.version,
                                               worker_id=self.worker_id)
                if end:
                    break
            await reader
        finally:
            reader.cancel()
            for task in list(tasks.values()):
                task.cancel()

    async def UpdateWeights(self, request, context):
        version, uri, served = int(request.version), request.uri, self.engine.version
        unusable = engine_unusable(self.engine)
        if unusable:  # it gave up for good: say so instead of trying again
            return sao_pb2.UpdateWeightsResponse(ok=False, version=served,
                                                 error=f"worker unusable: {unusable}")
        error = weights_request_error(version, uri, served=served, served_uri=self._served_uri,
                                      publish_root=self.config.publish_root,
                                      max_version_jump=self.config.max_version_jump)
        if error is None and version == served:  # the same (version, uri) again: loaded
            return sao_pb2.UpdateWeightsResponse(ok=True, version=served)
        try:
            if error is not None:
                self.refused_updates += 1
                raise ValueError(f"refused: {error}")
            t0 = time.perf_counter()
            await self.engine.load_weights(version, uri)
            if self.engine.version == version:  # not superseded by a newer concurrent load
                self._served_uri = uri
            log.info("%s loaded weights version %s in %.2f s", self.worker_id, version,
                     time.perf_counter() - t0)
            return sao_pb2.UpdateWeightsResponse(ok=True, version=self.engine.version)
        except Exception as e:  # errors as values
            log.warning("load_weights(%s, %s) failed: %r", request.version, request.uri, e)
            return sao_pb2.UpdateWeightsResponse(ok=False, version=self.engine.version,
                                                 error=f"{type(e).__name__}: {e}")

    async def Score(self, request, context):
        """Log-probs of the request's sequences (``Engine.score``) and the
        version that scored them; errors as values (an engine that cannot
        score, bad sequences, a weight swap during both attempts)."""
        try:
            seqs = [codec.decode_array(a, np.dtype("<i4")).ravel().tolist()
                    for a in request.sequences]
            if not 0 < len(seqs) <= MAX_SCORE_SEQUENCES or \
                    sum(map(len, seqs)) > MAX_SCORE_TOKENS:
                raise ValueError(f"1..{MAX_SCORE_SEQUENCES} sequences of at most "
                                 f"{MAX_SCORE_TOKENS} tokens in all, got {len(seqs)}")
            for _ in range(2):  # a weight swap during the call makes the version ambiguous
                version = self.engine.version
                out = await self.engine.score(seqs)
                if self.engine.version == version:
                    return sao_pb2.ScoreResponse(ok=True, version=version, logprobs=[
                        codec.encode_array(np.asarray(lp, np.float32), np.dtype("<f4"))
                        for lp in out])
            raise RuntimeError("the weights changed while scoring, twice")
        except Exception as e:  # errors as values
            log.warning("score failed: %r", e)
            return sao_pb2.ScoreResponse(ok=False, version=self.engine.version,
                                         error=f"{type(e).__name__}: {e}")

    async def Status(self, request, context):
        try:
            healthy = bool(await self.engine.health())
        except Exception:
            healthy = False
        return sao_pb2.StatusResponse(
            worker_id=self.worker_id, version=self.engine.version, active_episodes=self.active,
            max_concurrency=self.config.max_concurrency, completed=self.completed,
            failed=self.failed, generated_tokens=self.generated_tokens,
            uptime_s=time.monotonic() - self._t0, healthy=healthy,
            refused_updates=self.refused_updates,
            unusable=engine_unusable(self.engine))


@dataclasses.dataclass
class WorkerServer:
    """A running worker; ``await stop()`` ends it."""

    server: grpc.aio.Server
    servicer: RolloutServicer
    port: int
    address: str

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.server.stop(grace)

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def serve(engine: Engine, episode_fn: EpisodeFn, config: WorkerConfig = WorkerConfig(),
                *, servicer_cls: type[RolloutServicer] = RolloutServicer) -> WorkerServer:
    """Starts a worker on the running asyncio loop; returns once it listens.

    ``servicer_cls`` swaps the service implementation (fault-injection tests).
    Raises ValueError for a non-loopback ``host`` without a token
    (``credentials.check_bind``), RuntimeError if the port cannot be bound.
    """
    sec = config.security
    credentials.check_bind(config.host, sec)
    interceptors = [auth.TokenInterceptor(sec.token)] if sec.token else []
    server = grpc.aio.server(interceptors=interceptors, options=auth.server_options())
    servicer = servicer_cls(engine, episode_fn, config)
    sao_pb2_grpc.add_RolloutWorkerServicer_to_server(servicer, server)
    port = auth.add_port(server, f"{config.host}:{config.port}", sec)
    if port == 0:
        raise RuntimeError(f"could not bind {config.host}:{config.port}")
    await server.start()
    address = f"{config.host}:{port}"
    if not config.worker_id:
        servicer.worker_id = address
    log.info("rollout worker %s serving on %s", servicer.worker_id, address)
    return WorkerServer(server, servicer, port, address)


def run(make_engine_and_episode: Callable[[], tuple[Engine, EpisodeFn]],
        config: WorkerConfig = WorkerConfig(), *, ready: Callable[[str], None] | None = None,
        servicer_cls: type[RolloutServicer] = RolloutServicer) -> None:
    """Blocking entry point (the CLI role): builds the engine inside the
    worker's event loop, serves until SIGINT/SIGTERM, then stops cleanly.
    ``ready(address)`` is called once the server listens; ``servicer_cls`` as
    for ``serve``."""

    async def main():
        engine, episode_fn = make_engine_and_episode()
        worker = await serve(engine, episode_fn, config, servicer_cls=servicer_cls)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready(worker.address)
        await stop.wait()
        await worker.stop(grace=2.0)
        await engine.close()

    asyncio.run(main())
