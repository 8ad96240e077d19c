"""JaxEngine: continuous batching on the model's KV-cache sampler, in process.

A fixed number of slots (rows of one KV cache) serve requests from many
concurrent episodes. Each scheduler iteration (1) applies a pending weight
swap, (2) prefills queued requests into free slots (one row at a time, prompt
padded to a power-of-two bucket to bound recompiles, first token sampled from
the prefill logits), (3) runs a chunk of ``decode_chunk`` decode steps for all
slots on device (one `lax.scan`, one host round trip) and hands each active
row its tokens up to its stop token or budget. A finished row frees its slot
at the end of the chunk.

New weights come from a published checkpoint (`JaxEngine.load_weights`, a
rollout worker) or from memory (`JaxEngine.set_params`, the learner's
in-process engine). They are swapped only between chunks, and never drop a
request: rows keep
their KV cache (computed by the older weights, as in any partial rollout) and
every token records the version that sampled it, so versions are
non-decreasing along each completion (docs/algorithm.md §6).

Log-probs are those of ``sao.models.sample_tokens``: the chosen token under
the distribution it was drawn from (``log_softmax(logits / temperature)``
after top-p/top-k truncation); without truncation that is what
``token_logprobs(model, tokens, temperature=T)`` recomputes.

The jitted work runs in one worker thread so the asyncio loop (agent loops,
RPC) stays responsive while the device computes.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from sao.models import decode_step, init_cache, prefill, sample_tokens, write_cache_row
from sao.rollout.base import (Completion, Engine, EngineError, SamplingParams, check_prompt,
                              check_sequences)

log = logging.getLogger(__name__)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("truncate", "num_steps"),
                   donate_argnums=(4,))
def _decode_chunk(graphdef, params, last_tokens, positions, cache, rng, temperature, top_p,
                  top_k, *, truncate, num_steps):
    """``num_steps`` decode steps + sampling for every slot, on device.

    last_tokens, positions: i32[S]; returns (tokens i32[S, n], logprobs
    f32[S, n], cache). Rows that finish inside the chunk keep decoding (their
    extra tokens are discarded by the host); positions are clamped to the
    cache so such rows never write outside their own row.
    """
    max_pos = cache.max_len - 1

    def body(carry, key):
        last, pos, cache = carry
        model = nnx.merge(graphdef, params)
        logits, cache = decode_step(model, last, pos, cache)
        tok, lp = sample_tokens(key, logits, temperature, top_p, top_k, truncate=truncate)
        return (tok, jnp.minimum(pos + 1, max_pos), cache), (tok, lp)

    (_, _, cache), (tokens, logprobs) = jax.lax.scan(
        body, (last_tokens, positions, cache), jax.random.split(rng, num_steps))
    return tokens.T, logprobs.T, cache


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("truncate",),
                   donate_argnums=(4,))
def _admit(graphdef, params, tokens, length, cache, row, rng, temperature, top_p, top_k,
           *, truncate):
    """Prefills one prompt (i32[1, P], length i32[1]) into cache row ``row`` and
    samples its first token: -> (token i32[1], logprob f32[1], cache)."""
    model = nnx.merge(graphdef, params)
    row_cache = jax.tree.map(lambda c: jnp.zeros((1,) + c.shape[1:], c.dtype), cache)
    logits, row_cache = prefill(model, tokens, length, row_cache)
    cache = write_cache_row(cache, row, row_cache)
    token, logprob = sample_tokens(rng, logits, temperature, top_p, top_k, truncate=truncate)
    return token, logprob, cache


@functools.partial(jax.jit, static_argnums=(0,))
def _forced_logprobs(graphdef, params, tokens, cache):
    """Log-probs of tokens i32[B, T] by forced decoding on the serving path:
    prefill of token 0, then one decode step per later token, each fed the
    true token. -> f32[B, T] at temperature 1, column 0 is 0 (as
    ``token_logprobs``); entries past a row's end are meaningless."""
    model = nnx.merge(graphdef, params)
    b, t = tokens.shape
    logits, cache = prefill(model, tokens[:, :1], jnp.ones((b,), jnp.int32), cache)

    def body(carry, pos):
        logits, cache = carry
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, pos][:, None], -1)[:, 0]
        logits, cache = decode_step(model, tokens[:, pos], jnp.full((b,), pos, jnp.int32), cache)
        return (logits, cache), picked

    _, lps = jax.lax.scan(body, (logits, cache), jnp.arange(1, t))
    return jnp.concatenate([jnp.zeros((b, 1), jnp.float32), lps.T], axis=1)


@dataclasses.dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    max_new: int
    future: asyncio.Future
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)

    def append(self, token: int, logprob: float, version: int) -> str | None:
        """Records one sampled token; returns the finish reason if the row is done."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if token in self.params.stop_token_ids:
            return "stop"
        if len(self.tokens) >= self.max_new:
            return "length"
        return None


def _needs_truncation(params: SamplingParams) -> bool:
    return params.top_p < 1.0 or params.top_k > 0


class JaxEngine(Engine):
    """Embedded engine over a ``sao.models.Transformer``.

    Args:
      model: the policy (its ``nnx.Param`` state is served; the model object
        itself is not modified by weight loads).
      max_slots: concurrent sequences (rows of the KV cache).
      max_len: most tokens per sequence, prompt included (cache length).
      version: learner version of ``model``'s weights.
      seed: PRNG seed of the sampler.
      cache_dtype: KV cache dtype (default: the model's compute dtype).
      serve_dtype: dtype the served floating-point weights are cast to (e.g.
        ``jnp.bfloat16`` for a bf16 inference engine beside an f32 learner, as
        in production; the KV cache then defaults to it too); None serves the
        weights as given. Loaded / set weights must still match the model's
        own dtypes and are cast on arrival.
      decode_chunk: decode steps per device call (multi-step scheduling):
        fewer host round trips, at the price of admissions and weight swaps
        waiting up to that many steps and finished rows idling until the
        chunk ends. 1 = classic one-step continuous batching.
    Raises ValueError if ``max_slots``, ``max_len`` or ``decode_chunk`` is < 1.
    """

    def __init__(self, model, *, max_slots: int = 8, max_len: int = 1024, version: int = 0,
                 seed: int = 0, cache_dtype=None, decode_chunk: int = 8, serve_dtype=None):
        if max_slots < 1 or max_len < 2 or decode_chunk < 1:
            raise ValueError(f"max_slots >= 1, max_len >= 2 and decode_chunk >= 1 needed, "
                             f"got {max_slots}, {max_len}, {decode_chunk}")
        self.decode_chunk = int(decode_chunk)
        self.cfg = model.cfg
        self.max_slots, self.max_len = int(max_slots), int(max_len)
        self._graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        if jax.tree.leaves(self._rest):
            raise ValueError("JaxEngine serves models whose state is only nnx.Param")
        # Shapes / dtypes of the model's own weights: what loads must match.
        self._spec = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
        self.serve_dtype = None if serve_dtype is None else jnp.dtype(serve_dtype)
        self._params = self._cast(params)
        self._version = int(version)
        if cache_dtype is None and self.serve_dtype is not None:
            cache_dtype = self.serve_dtype
        self._cache_dtype = cache_dtype
        self._cache = init_cache(self.cfg, self.max_slots, self.max_len, cache_dtype)
        self._rng = jax.random.key(seed)
        self._slots: list[_Request | None] = [None] * self.max_slots
        self._queue: collections.deque[_Request] = collections.deque()
        self._pending: tuple[int, Any, asyncio.Future] | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jax-engine")
        self._failed: BaseException | None = None
        self.steps = 0  # decode steps run (for tests and metrics)

    @property
    def version(self) -> int:
        return self._version

    @property
    def num_active(self) -> int:
        return sum(r is not None for r in self._slots)

    # -- public API -----------------------------------------------------------------

    async def generate(self, prompt_tokens: Sequence[int], params: SamplingParams) -> Completion:
        prompt = check_prompt(prompt_tokens)
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_len={self.max_len}")
        if max(prompt) >= self.cfg.vocab_size:
            raise ValueError(f"prompt token {max(prompt)} >= vocab_size {self.cfg.vocab_size}")
        if self._failed is not None:
            raise EngineError(f"engine failed earlier: {self._failed!r}")
        max_new = min(params.max_new_tokens, self.max_len - len(prompt))
        req = _Request(prompt, params, max_new, asyncio.get_running_loop().create_future())
        self._queue.append(req)
        self._kick()
        return await req.future

    async def load_weights(self, version: int, uri: str) -> None:
        """Serves the published weights at ``uri`` from the next decode step on.

        ``uri``: the orbax checkpoint of the model's ``nnx.Param`` state that
        ``sao.ckpt.publish`` writes; restored in a thread while decoding goes
        on. Returns once the new weights are in use. Raises ValueError on an
        older version, a ``uri`` that is not a string, or weights of another
        structure.
        """
        if not isinstance(uri, str):
            raise ValueError(f"load_weights takes a checkpoint path, got {type(uri).__name__} "
                             "(in-memory weights go to set_params)")
        await self._swap(version, lambda: self._restore(uri))

    async def set_params(self, version: int, params: nnx.State) -> None:
        """Serves in-memory weights from the next decode step on (the learner's
        own engine: no checkpoint round trip).

        ``params``: an ``nnx.State`` of ``nnx.Param`` with the served model's
        structure, shapes and dtypes (e.g. ``nnx.state(model, nnx.Param)``);
        kept by reference, not copied. Returns once the weights are in use.
        Raises ValueError on an older version, something other than an
        ``nnx.State``, or a state of another structure.
        """
        if not isinstance(params, nnx.State):
            raise ValueError(f"set_params takes an nnx.State, got {type(params).__name__}")
        await self._swap(version, lambda: params)

    async def _swap(self, version: int, read) -> None:
        """Runs ``read() -> nnx.State`` in a thread, checks it, and swaps it in
        between decode chunks (at once when idle)."""
        if version < self._version or (self._pending and version < self._pending[0]):
            raise ValueError(f"version {version} is older than the served {self._version}")
        params = await asyncio.to_thread(lambda: self._checked(read()))
        if version < self._version or (self._pending and version < self._pending[0]):
            return  # a newer version finished loading first: this one is superseded
        if self._task is None or self._task.done():
            self._params, self._version = params, int(version)
            return
        done = asyncio.get_running_loop().create_future()
        if self._pending is not None and not self._pending[2].done():
            self._pending[2].set_result(None)  # superseded: a newer version wins
        self._pending = (int(version), params, done)
        self._kick()
        await done

    async def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probs of ``sequences`` under the served weights (``Engine.score``)
        by forced decoding through this engine's own prefill and decode steps
        (KV cache in its cache dtype): what its rollouts would report for
        those tokens at temperature 1. Runs on the device thread between
        decode chunks. Raises ValueError for a sequence longer than
        ``max_len`` or an id outside the vocabulary, EngineError after a
        device failure."""
        seqs = check_sequences(sequences)
        longest = max(map(len, seqs))
        if longest > self.max_len:
            raise ValueError(f"a sequence of {longest} tokens does not fit max_len={self.max_len}")
        if max(max(s) for s in seqs) >= self.cfg.vocab_size:
            raise ValueError(f"a token id >= vocab_size {self.cfg.vocab_size}")
        if self._failed is not None:
            raise EngineError(f"engine failed earlier: {self._failed!r}")
        bucket = min(self.max_len, max(16, 1 << (longest - 1).bit_length()))
        tokens = np.zeros((len(seqs), bucket), np.int32)
        for i, s in enumerate(seqs):
            tokens[i, :len(s)] = s
        params = self._params  # read on the loop thread, where swaps happen

        def run():
            cache = init_cache(self.cfg, len(seqs), bucket, self._cache_dtype)
            return np.asarray(_forced_logprobs(self._graphdef, params, jnp.asarray(tokens), cache))

        out = await asyncio.get_running_loop().run_in_executor(self._worker, run)
        return [out[i, :len(s)].tolist() for i, s in enumerate(seqs)]

    async def health(self) -> bool:
        return self._failed is None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._worker.shutdown(wait=True)

    # -- weights --------------------------------------------------------------------

    def _restore(self, uri: str) -> nnx.State:
        with ocp.StandardCheckpointer() as ckptr:
            return ckptr.restore(uri, self._spec)

    def _checked(self, params: nnx.State) -> nnx.State:
        want = jax.tree.map(lambda x: (x.shape, x.dtype), self._spec)
        got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
        if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
            raise ValueError("new weights do not match the served model's structure")
        return self._cast(params)

    def _cast(self, params: nnx.State) -> nnx.State:
        """``params`` with floating leaves in ``serve_dtype`` (unchanged when None)."""
        if self.serve_dtype is None:
            return params
        return jax.tree.map(lambda x: x.astype(self.serve_dtype)
                            if jnp.issubdtype(x.dtype, jnp.floating) else x, params)

    # -- scheduler ------------------------------------------------------------------

    def _kick(self):
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()  # events bind to the loop that runs the task
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wakeup.set()

    async def _run(self):
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._apply_pending()
                while self._queue and None in self._slots:
                    req = self._queue.popleft()
                    if req.future.done():  # cancelled by its caller
                        continue
                    row = self._slots.index(None)
                    tok, lp = await loop.run_in_executor(self._worker, self._admit_sync, req, row)
                    self._record(row, req, tok, lp)
                if not any(self._slots):
                    if not self._queue:
                        self._wakeup.clear()
                        await self._wakeup.wait()
                    continue
                toks, lps = await loop.run_in_executor(self._worker, self._step_sync)
                for row, req in enumerate(list(self._slots)):
                    for j in range(toks.shape[1] if req is not None else 0):
                        if self._slots[row] is not req:  # finished inside the chunk
                            break
                        self._record(row, req, int(toks[row, j]), float(lps[row, j]))
        except asyncio.CancelledError:
            self._fail_all(EngineError("engine closed"))
            raise
        except Exception as e:  # a device error: fail every request, keep a clear state
            log.exception("JaxEngine step failed")
            self._failed = e
            self._fail_all(EngineError(f"engine step failed: {e!r}"))

    def _apply_pending(self):
        if self._pending is not None:
            version, params, done = self._pending
            self._pending = None
            self._params, self._version = params, version
            if not done.done():
                done.set_result(None)

    def _record(self, row: int, req: _Request, token: int, logprob: float):
        finish = req.append(token, logprob, self._version)
        if req.future.done():  # the caller went away: free the slot
            self._slots[row] = None
        elif finish is not None:
            self._slots[row] = None
            req.future.set_result(Completion(req.tokens, req.logprobs, req.versions, finish))
        else:
            self._slots[row] = req

    def _fail_all(self, error: Exception):
        for req in [r for r in self._slots if r is not None] + list(self._queue):
            if not req.future.done():
                req.future.set_exception(error)
        self._slots = [None] * self.max_slots
        self._queue.clear()
        if self._pending is not None and not self._pending[2].done():
            self._pending[2].set_exception(error)
        self._pending = None

    def _next_rng(self):
        self._rng, sub = jax.random.split(self._rng)
        return sub

    def _admit_sync(self, req: _Request, row: int) -> tuple[int, float]:
        n = len(req.prompt)
        bucket = min(self.max_len, max(16, 1 << (n - 1).bit_length()))
        tokens = np.zeros((1, bucket), np.int32)
        tokens[0, :n] = req.prompt
        p = req.params
        tok, lp, self._cache = _admit(
            self._graphdef, self._params, jnp.asarray(tokens), jnp.asarray([n], jnp.int32),
            self._cache, jnp.int32(row), self._next_rng(), jnp.float32(p.temperature),
            jnp.float32(p.top_p), jnp.int32(max(p.top_k, 0)), truncate=_needs_truncation(p))
        return int(tok[0]), float(lp[0])

    def _step_sync(self) -> tuple[np.ndarray, np.ndarray]:
        """One decode chunk: -> (tokens i32[S, n], logprobs f32[S, n]) on the host."""
        s = self.max_slots
        last, pos = np.zeros(s, np.int32), np.zeros(s, np.int32)
        temp, top_p, top_k = np.ones(s, np.float32), np.ones(s, np.float32), np.zeros(s, np.int32)
        truncate = False
        for row, req in enumerate(self._slots):
            if req is None:
                continue
            last[row] = req.tokens[-1]
            pos[row] = len(req.prompt) + len(req.tokens) - 1
            temp[row], top_p[row], top_k[row] = (req.params.temperature, req.params.top_p,
                                                 max(req.params.top_k, 0))
            truncate |= _needs_truncation(req.params)
        toks, lps, self._cache = _decode_chunk(
            self._graphdef, self._params, jnp.asarray(last), jnp.asarray(pos), self._cache,
            self._next_rng(), jnp.asarray(temp), jnp.asarray(top_p), jnp.asarray(top_k),
            truncate=truncate, num_steps=self.decode_chunk)
        self.steps += self.decode_chunk
        return np.asarray(toks), np.asarray(lps)
