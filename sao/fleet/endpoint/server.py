"""The OpenAI-compatible HTTP endpoint of a rollout worker (aiohttp).

``POST /s/<session>/v1/chat/completions``: a harness is given the base URL
``http://host:port/s/<session>/v1`` and the run's token as its API key, and
calls it like any provider. Every call needs ``Authorization: Bearer
<token>`` (compared in constant time, ``sao.rpc.auth.token_ok``); the server
refuses to start without a token and binds loopback unless given a
non-loopback host (``sao.rpc.credentials.check_bind``). Bodies over
``max_body_bytes`` are refused (413) before they are read whole; a body that
is not JSON gets 400 ``invalid_json``. Errors are OpenAI error objects
(``messages.RequestError``); no error in one session touches another.

The server runs on the worker's event loop, beside its gRPC service, and
samples with the worker's engine: sessions are opened by the worker's episode
function (sao/fleet/endpoint/episode.py), never by a harness.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import secrets
import time
from typing import Any

from aiohttp import web

from sao.fleet.endpoint.dialect import dialect_for
from sao.fleet.endpoint.messages import RequestError, parse_request
from sao.fleet.endpoint.session import Session
from sao.fleet.endpoint.transcripts import Recorder
from sao.rollout.base import Engine, EngineError, SamplingParams
from sao.rpc import auth, credentials

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EndpointConfig:
    """Where and how the endpoint serves.

    Attributes:
      token: the run's token (required, non-empty).
      host, port: bind address (127.0.0.1; port 0 picks a free one).
      max_body_bytes: largest request body (bytes).
      max_sessions: open sessions at most (a worker opens one per episode).
      record_dir: when set, every call is appended to ``<record_dir>/<session>.jsonl``
        (``sao.fleet.endpoint.transcripts``: input of ``python -m sao.fleet.harness_check``).
    """

    token: str
    host: str = "127.0.0.1"
    port: int = 0
    max_body_bytes: int = 8 * 1024 * 1024
    max_sessions: int = 1024
    record_dir: str = ""

    def __post_init__(self):
        if not self.token:
            raise ValueError("the endpoint needs the run's token: no open port without credentials")
        if self.max_body_bytes < 1024 or self.max_sessions < 1:
            raise ValueError("max_body_bytes >= 1024 and max_sessions >= 1 needed")


class Endpoint:
    """Sessions over one engine, served over HTTP once ``start`` ran.

    ``counters`` (a ``Counter``) holds ``requests``, ``sessions_opened``,
    ``sessions_closed`` and one ``error/<code>`` per refused call.
    """

    def __init__(self, engine: Engine, tokenizer, config: EndpointConfig):
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.dialect = dialect_for(tokenizer)
        self.sessions: dict[str, Session] = {}
        self.counters: collections.Counter = collections.Counter()
        self.recorder = Recorder(config.record_dir) if config.record_dir else None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- sessions ------------------------------------------------------------
    def open_session(self, sampling: SamplingParams, *, max_turns: int,
                     max_total_tokens: int) -> Session:
        """A new session (random id); raises RuntimeError when ``max_sessions`` are open."""
        if len(self.sessions) >= self.config.max_sessions:
            raise RuntimeError(f"{len(self.sessions)} sessions open (max_sessions)")
        sid = secrets.token_hex(16)
        self.sessions[sid] = Session(sid, self.engine, self.tokenizer, self.dialect, sampling,
                                     max_turns=max_turns, max_total_tokens=max_total_tokens)
        self.counters["sessions_opened"] += 1
        return self.sessions[sid]

    def close_session(self, session: Session, reason: str = "closed") -> None:
        """Ends ``session`` (later calls: ``session_ended``) and forgets it."""
        session.abandon(reason)
        if self.sessions.pop(session.id, None) is not None:
            self.counters["sessions_closed"] += 1
            self.counters[f"end/{session.ended}"] += 1

    def base_url(self, session: Session) -> str:
        """What a harness is told: ``http://host:port/s/<id>/v1``."""
        return f"http://{self.config.host}:{self.port}/s/{session.id}/v1"

    # -- HTTP ----------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.Response:
        self.counters["requests"] += 1
        try:
            if not auth.token_ok([(auth.METADATA_KEY, request.headers.get("Authorization"))],
                                 self.config.token):
                raise RequestError(401, "invalid_api_key", "missing or wrong token")
            session = self.sessions.get(request.match_info["session"])
            if session is None:
                raise RequestError(404, "unknown_session",
                                   "no such session (ended, or never opened by this worker)")
            if (request.content_length or 0) > self.config.max_body_bytes:
                raise RequestError(413, "body_too_large",
                                   f"request body over {self.config.max_body_bytes} bytes")
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, "body_too_large",
                                   f"request body over {self.config.max_body_bytes} bytes")
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise RequestError(400, "invalid_json", f"the body is not JSON: {e}")
            try:
                result = await session.complete(parse_request(body))
            except EngineError as e:   # the engine failed (closed, server down): the episode is lost
                session.abandon("engine_error")
                raise RequestError(500, "engine_error", f"the engine failed: {e}") from e
            except RequestError as e:
                if self.recorder:
                    self.recorder.record(session.id, body, e.body())
                raise
            if self.recorder:
                self.recorder.record(session.id, body, result)
            return web.json_response(result)
        except RequestError as e:
            self.counters[f"error/{e.code}"] += 1
            return web.json_response(e.body(), status=e.status)

    async def _models(self, request: web.Request) -> web.Response:
        if not auth.token_ok([(auth.METADATA_KEY, request.headers.get("Authorization"))],
                             self.config.token):
            e = RequestError(401, "invalid_api_key", "missing or wrong token")
            return web.json_response(e.body(), status=e.status)
        return web.json_response({"object": "list", "data": [
            {"id": "sao-policy", "object": "model", "created": int(time.time()), "owned_by": "sao"}]})

    async def start(self) -> None:
        """Binds and serves on the running loop. Raises ValueError for a
        non-loopback host (``check_bind``), OSError if the port is taken."""
        credentials.check_bind(self.config.host, auth.Security(token=self.config.token))
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/s/{session}/v1/chat/completions", self._chat)
        app.router.add_get("/s/{session}/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        log.info("harness endpoint on http://%s:%d", self.config.host, self.port)

    async def stop(self) -> None:
        for session in list(self.sessions.values()):
            self.close_session(session, "endpoint_stopped")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def stats(self) -> dict[str, Any]:
        return dict(self.counters) | {"open_sessions": len(self.sessions)}
