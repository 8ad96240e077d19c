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
* Weights (``reload``): in either mode new requests wait and in-flight ones
  finish first, so every completion has one version. ``"update_weights_from_disk"``
  posts the HF directory to that endpoint, then ``/flush_cache?timeout=T``
  (SGLang; the server waits for its scheduler to go idle). SGLang 0.5.23 answers
  HTTP 400 "Weights were updated, but the cache was not flushed" when a finished
  request had not yet left its scheduler: the flush is then made, and a flush
  that does not happen fails the load. Servers without the endpoint (sglang-jax
  answers 404) reload by ``"restart"``: the supervised ``SGLangServer`` is
  restarted on the new directory. A
  supervised server found dead (or never started) is started on the next
  load in either mode: a rollout worker starts its server with the learner's
  first weights (``sao.sglang_setup``).
* Failures are bounded: ``max_reload_failures`` loads failing in a row make
  the engine unusable (``unusable`` says why): every later call raises
  EngineError at once and ``health()`` is False, so the worker can report
  itself unusable instead of being retried forever. A load that succeeds in
  between resets the count.

Versions: a completion is labelled with the version the client served when
the request was sent (or the server's ``weight_version`` if it reports one).
This engine's own requests never overlap a load (it drains them first); on
an attached server that other clients also reload, a label can only be
older than the truth, which errs on the safe side of the staleness bound
(docs/algorithm.md §6).
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from typing import Any, Sequence

import aiohttp

from sao.rollout.base import (Completion, Engine, EngineError, SamplingParams, check_prompt,
                              check_sequences)

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
# SGLang's answer (HTTP 400) when it loaded new weights but could not drop its
# prefix cache because a request was still running or queued.
_UPDATED_NOT_FLUSHED = "Weights were updated, but the cache was not flushed"
RELOAD_MODES = ("update_weights_from_disk", "restart")


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
      server: the ``SGLangServer`` serving ``base_url`` when this engine
        supervises it (started by the caller; ``health()`` is False while its
        process is dead, and a load restarts it), or None to attach by URL.
      reload: ``"update_weights_from_disk"`` or ``"restart"`` (needs ``server``).
      reload_timeout_s: time allowed for one ``/update_weights_from_disk``
        attempt (retried like other requests), and how long the server may wait
        for idle before the ``/flush_cache`` that follows; a restart is bounded
        by the server's own stop and ready timeouts.
      max_reload_failures: loads failing in a row before the engine is unusable.
      owns_server: ``close()`` also stops ``server`` (the engine's owner
        handed it over, e.g. a rollout worker's own server).
    Raises ValueError on an unknown ``reload``, ``"restart"`` without a server,
    or ``max_reload_failures < 1``.
    """

    def __init__(self, base_url: str, *, version: int = 0, timeout_s: float = 600.0,
                 connect_timeout_s: float = 10.0, max_retries: int = 3, backoff_s: float = 0.5,
                 server=None, reload: str = "update_weights_from_disk",
                 reload_timeout_s: float = 120.0, max_reload_failures: int = 3,
                 owns_server: bool = False):
        if reload not in RELOAD_MODES:
            raise ValueError(f"reload must be one of {RELOAD_MODES}, got {reload!r}")
        if reload == "restart" and server is None:
            raise ValueError("reload='restart' needs the SGLangServer to restart")
        if max_reload_failures < 1:
            raise ValueError(f"max_reload_failures must be >= 1, got {max_reload_failures}")
        self.base_url = base_url.rstrip("/")
        self._version = int(version)
        self._loaded_uri: str | None = None   # the HF directory the last load served
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._reload_timeout = aiohttp.ClientTimeout(total=reload_timeout_s,
                                                     connect=connect_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.server = server
        self.owns_server = bool(owns_server and server is not None)
        self.reload = reload
        self.max_reload_failures = int(max_reload_failures)
        self.reload_failures = 0  # in a row
        self.unusable: str | None = None  # why the engine gave up, once it has
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
        self._open = asyncio.Event()  # cleared while a reload runs
        self._open.set()
        self._inflight = 0
        self._idle = asyncio.Event()  # set while no request is in flight
        self._idle.set()
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
        self._check_usable()
        self._bind_loop()
        await self._enter()
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
            self._leave()

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Prompt log-probs of ``sequences`` (``Engine.score``): one
        ``/generate`` per sequence with ``return_logprob``,
        ``logprob_start_len=0``, temperature 1 and one new token (sglang-jax
        samples one even when asked for none);
        ``meta_info.input_token_logprobs`` (``[[logprob, id, text], ...]``,
        the first logprob null) gives the answer (``_parse_input_logprobs``).
        Waits for a reload like ``generate``. Raises EngineError on a
        malformed answer (ids that are not the sequence's, a missing or
        non-finite log-prob)."""
        seqs = check_sequences(sequences)
        self._check_usable()
        self._bind_loop()
        await self._enter()
        try:
            outs = await asyncio.gather(*(self._post("/generate", {
                "input_ids": seq, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": 1}}) for seq in seqs))
        finally:
            self._leave()
        return [_parse_input_logprobs(out, seq) for out, seq in zip(outs, seqs)]

    async def _enter(self) -> None:
        """Waits while a reload runs, then counts this request in flight. The gate is
        checked again after each wake-up: a second reload may close it before this
        coroutine runs."""
        while not self._open.is_set():
            await self._open.wait()
        self._check_usable()  # a reload that failed for good while this request waited
        self._inflight += 1
        self._idle.clear()

    def _leave(self) -> None:
        """Counts a request out, without awaiting (a cancelled request cannot skip it)."""
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    async def load_weights(self, version: int, uri: str) -> None:
        """Serves the HF directory ``uri`` as learner ``version``.

        A ``sao.ckpt.publish`` uri (``<version dir>/params``, orbax) is mapped
        to its HF export ``<version dir>/hf`` (publish with ``hf_export``);
        the path must be readable by the server.

        Raises ValueError if ``version`` is older than the served one or ``uri``
        is not a path; EngineError if the server refuses the update, the
        restart fails, or the engine is unusable (``max_reload_failures``
        loads failed in a row; the message says so).
        """
        self._check_usable()
        if version < self._version:
            raise ValueError(f"version {version} is older than the served {self._version}")
        if not isinstance(uri, str):
            raise ValueError(f"SGLangEngine loads HF directories (a path), "
                             f"got {type(uri).__name__}")
        uri = hf_dir_of(uri)
        self._bind_loop()
        async with self._reload_lock:  # one reload at a time, in version order
            if version < self._version or (version == self._version and uri == self._loaded_uri):
                return  # this or a newer version was loaded while this call waited
            self._check_usable()  # a load that waited for the lock may find it given up
            try:
                await self._reload(int(version), uri)
                self._loaded_uri = uri
            except Exception as e:
                self.reload_failures += 1
                if self.reload_failures >= self.max_reload_failures:
                    self.unusable = (f"{self.reload_failures} weight loads failed in a row, "
                                     f"the last ({uri}, version {version}): {e}")
                    log.error("SGLang engine at %s is unusable: %s", self.base_url, self.unusable)
                raise
            self.reload_failures = 0

    def _check_usable(self) -> None:
        if self.unusable is not None:
            raise EngineError(f"SGLang engine at {self.base_url} is unusable: {self.unusable}")

    def _server_dead(self) -> bool:
        return self.server is not None and not self.server.running()

    async def _reload(self, version: int, uri: str) -> None:
        """Holds new requests and drains in-flight ones (so no completion mixes two
        versions and no request reads the prefix cache of the old weights), then
        restarts the server or updates it in place and drops its cache."""
        restart = self.reload == "restart" or self._server_dead()
        self._open.clear()
        try:
            while self._inflight:
                await self._idle.wait()
            if restart:
                if self._session is not None:
                    await self._session.close()
                try:
                    await asyncio.to_thread(self.server.restart, uri)
                except (RuntimeError, OSError) as e:  # not ready in time, exited, no python
                    raise EngineError(f"restarting the server on {uri} failed: {e}") from e
            else:
                await self._update_from_disk(version, uri)
            self._version = version
        finally:
            self._open.set()

    async def _update_from_disk(self, version: int, uri: str) -> None:
        try:
            out = await self._post("/update_weights_from_disk",
                                   {"model_path": uri, "weight_version": str(version)},
                                   timeout=self._reload_timeout)
        except EngineError as e:
            if _UPDATED_NOT_FLUSHED not in str(e):
                raise
            # The weights are in; the prefix cache still holds KV of the old weights
            # because a request had not left the server's scheduler yet (another client,
            # or our last one a moment late). Serving from it would give
            # rollout_logprobs of neither policy, so the flush must happen.
            log.info("weights %s loaded, cache flush deferred: %s", uri, e)
            await self._flush_cache()
            return
        if not out.get("success", False):
            raise EngineError(f"update_weights_from_disk refused: {out.get('message', out)}")
        try:  # a success means SGLang >= 0.5 flushed; older servers did not
            await self._flush_cache()
        except EngineError as e:  # e.g. another client of an attached server kept it busy
            log.warning("flush_cache after a weight update that succeeded: %s", e)

    async def _flush_cache(self) -> None:
        """``POST /flush_cache?timeout=T``: the server waits up to T seconds
        (``reload_timeout_s``) for its scheduler to go idle, then drops its prefix
        cache. Answers 200 with plain text on success, 400 otherwise.
        Raises EngineError when it does not flush."""
        wait_s = float(self._reload_timeout.total or 60.0)
        timeout = aiohttp.ClientTimeout(total=wait_s + 30.0, connect=10.0)
        try:
            async with self._http().post(self.base_url + "/flush_cache",
                                         params={"timeout": f"{wait_s:g}"},
                                         timeout=timeout) as resp:
                text = await resp.text()
                if resp.status == 200:
                    return
                if resp.status == 404:  # a server without the endpoint keeps no prefix cache to drop
                    log.warning("%s has no /flush_cache: %s", self.base_url, text[:200])
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise EngineError(f"/flush_cache after a weight update failed: {e!r}") from e
        raise EngineError(f"/flush_cache after a weight update failed with HTTP "
                          f"{resp.status}: {text[:300]}")

    async def health(self) -> bool:
        """``GET /health`` answers 200 and a one-token generation succeeds
        (False at once when unusable or the supervised server is dead)."""
        if self.unusable is not None or self._server_dead():
            return False
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
        """Closes the HTTP session; with ``owns_server`` also stops the server."""
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
            self._session = None
        if self.owns_server:
            await asyncio.to_thread(self.server.stop)


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


def _parse_input_logprobs(out: dict[str, Any], seq: list[int]) -> list[float]:
    """``meta_info.input_token_logprobs`` of a ``/generate`` answer for the
    input ``seq`` (sent with ``logprob_start_len=0``) -> ``[0.0, lp_1, ...,
    lp_{n-1}]``.

    Both servers (SGLang 0.5.23, sglang-jax 0.1.0rc0) answer exactly
    ``len(seq)`` entries ``[logprob, id, text]``, the first logprob null, and
    echo the ids sent, except one: an id ``>= vocab_size - 1`` is reported
    as 0 (their clip for image-token hashes; ``vocab_size`` is the model's,
    and ids ``>= vocab_size`` are refused). Where a model's vocabulary has a
    real token at its last row (the tiny Qwen3's ``</tool_response>``), that
    token reads 0; its log-prob is right. So an entry may say 0 where ``seq``
    holds its largest id; any other difference, a missing or a non-finite
    log-prob raises EngineError.
    """
    try:
        entries = out["meta_info"]["input_token_logprobs"]
        ids = [int(e[1]) for e in entries]
        lps = [None if e[0] is None else float(e[0]) for e in entries]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise EngineError(f"malformed input_token_logprobs: {str(out)[:300]}") from e
    if len(ids) != len(seq):
        raise EngineError(f"input_token_logprobs cover {len(ids)} ids, not the {len(seq)} of "
                          f"the scored sequence {seq[:8]}...")
    top = max(seq)
    bad = [i for i, (got, want) in enumerate(zip(ids, seq))
           if got != want and not (got == 0 and want == top)]
    if bad:
        raise EngineError(f"input_token_logprobs' ids differ from the scored sequence at "
                          f"{len(bad)} positions, first {bad[0]}: {ids[bad[0]]} for "
                          f"{seq[bad[0]]}")
    rest = lps[1:]
    if any(v is None or not math.isfinite(v) for v in rest):
        raise EngineError("input_token_logprobs has a missing or non-finite log-prob")
    return [0.0, *rest]
