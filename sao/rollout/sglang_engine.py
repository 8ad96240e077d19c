"""SGLangEngine: the ``Engine`` interface over SGLang's native HTTP API.

Token-in/token-out: ``POST /generate`` with ``input_ids`` and
``return_logprob``; the server must run with ``--skip-tokenizer-init``. The
same client serves PyTorch SGLang on GPUs (``sglang.launch_server``) and
sglang-jax on CPU/TPU (``sgl_jax.launch_server``); docs/rollout.md has both
launch commands.

Facts this client relies on (checked against sglang-jax 0.1.0rc0):
* ``meta_info.output_token_logprobs`` is ``[[logprob, token_id, text], ...]``
  at the sampling temperature; non-streaming answers over 50 tokens may repeat
  entries, so the last ``len(output_ids)`` entries are used (and checked).
* ``finish_reason.type`` is ``stop`` (a stop id or the model's eos, kept in
  ``output_ids``), ``length`` or ``abort``.
* Weights: ``POST /update_weights_from_disk`` then ``/flush_cache``. Servers
  without that endpoint (sglang-jax) reload by restarting
  (``restart_on_reload=True`` with a ``SGLangServer``): new requests wait,
  in-flight ones finish first, so every completion has one version.

Versions: a completion is labelled with the version the client served when
the request was sent (or the server's ``weight_version`` if it reports one).
A request that overlaps a disk update may have been served by the newer
weights: the label can only be older than the truth, which errs on the safe
side of the staleness bound (docs/algorithm.md §6).
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any, Sequence

import aiohttp

from sao.rollout.base import Completion, Engine, EngineError, SamplingParams, check_prompt

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class _Retryable(Exception):
    pass


class SGLangEngine(Engine):
    """Async client of one SGLang server.

    Args:
      base_url: e.g. ``"http://127.0.0.1:30000"``.
      version: learner version of the weights the server starts with.
      timeout_s: total time allowed for one HTTP attempt (a long generation
        counts); connect_timeout_s: time to connect.
      max_retries: extra attempts after a connection error, timeout, 5xx/429
        or aborted request; backoff_s: first wait, doubled each retry (+jitter).
      server: the ``SGLangServer`` to restart when ``restart_on_reload``.
      restart_on_reload: reload weights by restarting ``server`` on the new
        model directory instead of ``/update_weights_from_disk``.
    Raises ValueError if ``restart_on_reload`` is set without a server.
    """

    def __init__(self, base_url: str, *, version: int = 0, timeout_s: float = 600.0,
                 connect_timeout_s: float = 10.0, max_retries: int = 3, backoff_s: float = 0.5,
                 server=None, restart_on_reload: bool = False):
        if restart_on_reload and server is None:
            raise ValueError("restart_on_reload needs the SGLangServer to restart")
        self.base_url = base_url.rstrip("/")
        self._version = int(version)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.server = server
        self.restart_on_reload = restart_on_reload
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.num_retries = 0

    @property
    def version(self) -> int:
        return self._version

    def _bind_loop(self) -> None:
        """Sessions and asyncio primitives belong to one event loop: a caller
        may drive this engine from successive ``asyncio.run`` calls."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._session = None  # a session of a closed loop cannot be reused
        self._open = asyncio.Event()  # cleared while a restart-reload runs
        self._open.set()
        self._inflight = 0
        self._idle = asyncio.Condition()
        self._reload_lock = asyncio.Lock()

    def _http(self) -> aiohttp.ClientSession:
        self._bind_loop()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _post(self, path: str, payload: dict[str, Any], *, retries: int | None = None,
                    timeout: aiohttp.ClientTimeout | None = None) -> dict[str, Any]:
        """POSTs JSON with retries; returns the JSON answer or raises EngineError."""
        retries = self.max_retries if retries is None else retries
        last: Exception | None = None
        for attempt in range(retries + 1):
            if attempt:
                self.num_retries += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random()))
            try:
                async with self._http().post(self.base_url + path, json=payload,
                                             timeout=timeout or self._timeout) as resp:
                    text = await resp.text()
                    if resp.status in _RETRY_STATUS:
                        raise _Retryable(f"HTTP {resp.status}: {text[:300]}")
                    if resp.status != 200:
                        raise EngineError(f"{path} failed with HTTP {resp.status}: {text[:300]}")
                    try:
                        return await resp.json(content_type=None)
                    except ValueError as e:
                        raise EngineError(f"{path} returned invalid JSON: {text[:300]}") from e
            except (_Retryable, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                    asyncio.TimeoutError) as e:
                last = e
                log.warning("%s attempt %d/%d failed: %r", path, attempt + 1, retries + 1, e)
        raise EngineError(f"{path} failed after {retries + 1} attempts: {last!r}")

    async def generate(self, prompt_tokens: Sequence[int], params: SamplingParams) -> Completion:
        prompt = check_prompt(prompt_tokens)
        payload = {
            "input_ids": prompt,
            "sampling_params": {
                "temperature": params.temperature, "top_p": params.top_p,
                "top_k": params.top_k if params.top_k > 0 else -1,
                "max_new_tokens": params.max_new_tokens,
                "stop_token_ids": list(params.stop_token_ids),
            },
            "return_logprob": True,
        }
        self._bind_loop()
        await self._open.wait()
        self._inflight += 1
        try:
            for attempt in range(self.max_retries + 1):
                version = self._version
                out = await self._post("/generate", payload)
                try:
                    return _parse_completion(out, version)
                except _Retryable as e:  # aborted by the server (e.g. shutting down)
                    log.warning("generate attempt %d aborted: %s", attempt + 1, e)
                    self.num_retries += 1
                    await asyncio.sleep(self.backoff_s * 2 ** attempt)
            raise EngineError(f"generate aborted {self.max_retries + 1} times")
        finally:
            async with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    async def load_weights(self, version: int, uri: str) -> None:
        """Serves the HF directory ``uri`` as learner ``version``.

        A ``sao.ckpt.publish`` uri (``<version dir>/params``, orbax) is mapped
        to its HF export ``<version dir>/hf`` (publish with ``hf_export``);
        the path must be readable by the server.

        Raises ValueError if ``version`` is older than the served one or ``uri``
        is not a path; EngineError if the server refuses the update.
        """
        if version < self._version:
            raise ValueError(f"version {version} is older than the served {self._version}")
        if not isinstance(uri, str):
            raise ValueError(f"SGLangEngine loads HF directories (a path), "
                             f"got {type(uri).__name__}")
        uri = hf_dir_of(uri)
        self._bind_loop()
        async with self._reload_lock:  # one reload at a time, in version order
            if version < self._version:
                return  # a newer version was loaded while this one waited
            await self._reload(int(version), uri)

    async def _reload(self, version: int, uri: str) -> None:
        if self.restart_on_reload:
            self._open.clear()
            try:
                async with self._idle:
                    await self._idle.wait_for(lambda: self._inflight == 0)
                if self._session is not None:
                    await self._session.close()
                await asyncio.to_thread(self.server.restart, uri)
                self._version = version
            finally:
                self._open.set()
            return
        out = await self._post("/update_weights_from_disk",
                               {"model_path": uri, "weight_version": str(version)})
        if not out.get("success", False):
            raise EngineError(f"update_weights_from_disk refused: {out.get('message', out)}")
        self._version = version
        try:  # the update already flushes on recent servers; this is belt and braces
            await self._post("/flush_cache", {}, retries=0)
        except EngineError as e:
            log.info("flush_cache after weight update: %s", e)

    async def health(self) -> bool:
        """``GET /health`` answers 200 and a one-token generation succeeds."""
        probe = aiohttp.ClientTimeout(total=30.0)
        try:
            async with self._http().get(self.base_url + "/health", timeout=probe) as resp:
                if resp.status != 200:
                    return False
            out = await self._post("/generate", {
                "input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True}, retries=0, timeout=probe)
            _parse_completion(out, self._version)
            return True
        except (EngineError, _Retryable, aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return False

    async def close(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
            self._session = None


def hf_dir_of(uri: str) -> str:
    """The HF directory for a load: ``<dir>/params`` (a publish uri) -> ``<dir>/hf``,
    anything else unchanged."""
    path = uri.rstrip("/")
    if os.path.basename(path) == "params":
        return os.path.join(os.path.dirname(path), "hf")
    return uri


def _parse_completion(out: dict[str, Any], version: int) -> Completion:
    """Turns a ``/generate`` answer into a Completion; raises EngineError if malformed."""
    try:
        ids = [int(t) for t in out["output_ids"]]
        meta = out["meta_info"]
        finish = (meta.get("finish_reason") or {}).get("type")
        entries = meta["output_token_logprobs"]
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"malformed /generate answer: {str(out)[:300]}") from e
    if finish == "abort":
        raise _Retryable(str(meta.get("finish_reason")))
    if finish not in ("stop", "length"):
        raise EngineError(f"unknown finish_reason {meta.get('finish_reason')!r}")
    if not ids:
        raise EngineError("server returned no tokens")
    entries = entries[-len(ids):]  # long answers repeat entries: the last n are right
    if len(entries) != len(ids) or [int(e[1]) for e in entries] != ids:
        raise EngineError("output_token_logprobs do not match output_ids")
    served = meta.get("weight_version")
    if served is not None and str(served).isdigit():
        version = int(served)
    return Completion(tokens=ids, logprobs=[float(e[0]) for e in entries],
                      versions=[version] * len(ids), finish_reason=finish)
