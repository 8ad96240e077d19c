"""The log-prob parity gate: every rollout server scores a fixed probe set as the learner does.

A server that disagrees with the learner about the policy (another tokenizer
or chat template, another dtype, other rope settings, weights not loaded or
half loaded) crashes nothing: it samples from another policy, the importance
ratios of its tokens are off, and the run trains on them for days. The gate
measures the disagreement directly and stops using such a server.

* **Probe set** (``sao.fleet.probe``): a few fixed conversations in the
  run's tokenizer and turn format, deterministic.
* **Learner**: scores it with the published params (``sao.models.token_logprobs``
  at temperature 1) for every version it pushes (``ParityGate.set_reference``).
* **Server**: scores it through the worker's ``Score`` rpc (``Engine.score``:
  forced decoding on ``JaxEngine``'s own decode path, prompt log-probs on an
  SGLang server) when the worker joins (start-up, rejoin) and after every
  weight push it acknowledges.
* **Gap** (`token_gaps`): ``|server - learner|`` per probe token (all but the
  first of each sequence), its mean and max, in nats, logged per server and
  version (``snapshot``: ``parity/<address>/mean_gap``, ``/max_gap``,
  ``/version``).
* **Verdict**: a mean gap above ``max_mean_gap`` (default 0.1 nats; a
  float32 learner against a bfloat16 server of a real model differs by about
  0.03, a wrong rope theta by 0.26, half-loaded weights by 17:
  docs/fleet.md), or a max gap above ``max_token_gap`` (off by default), or
  an answer that cannot be compared (an engine that cannot score, wrong
  shapes, non-finite or positive log-probs) fails the check: the dispatcher
  quarantines the server (``Dispatcher.quarantine``: no more leases, its
  prompts issued again to the others). When no server is left, the fleet
  error names the likely causes (``LIKELY_CAUSES``).

Not thread-safe by itself: results are recorded under the gate's own lock
(link threads and the push pool check servers concurrently).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
from typing import Callable, Sequence

import numpy as np

from sao.rpc import codec, sao_pb2

log = logging.getLogger(__name__)

LIKELY_CAUSES = ("likely causes: another tokenizer or chat template, another dtype, other "
                 "rope settings (rope_theta, scaling), weights not loaded or half loaded "
                 "(docs/fleet.md, 'Log-prob parity gate')")
_KEEP_REFERENCES = 8  # versions whose reference log-probs are kept
_UNUSABLE = "unusable answer"  # scores that cannot be compared (shapes, values)


def token_gaps(reference: Sequence[np.ndarray], scored: Sequence[np.ndarray]) -> np.ndarray:
    """Per-token ``|scored - reference|`` of every probe token but the first
    of each sequence, concatenated: f64[N] in nats.

    Args:
      reference, scored: one f32[T_i] per sequence, aligned as
        ``token_logprobs`` (entry 0 is not a log-prob and is left out).
    Raises ValueError if the counts or a length differ.
    """
    if len(reference) != len(scored):
        raise ValueError(f"{len(scored)} scored sequences for {len(reference)} probes")
    gaps = []
    for ref, got in zip(reference, scored):
        ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        if ref.shape != got.shape or ref.ndim != 1:
            raise ValueError(f"scored shape {got.shape} for a probe of shape {ref.shape}")
        gaps.append(np.abs(got[1:] - ref[1:]))
    return np.concatenate(gaps)


@dataclasses.dataclass(frozen=True)
class ParityResult:
    """One server's check at one version.

    ``mean_gap`` / ``max_gap``: nats (NaN when nothing could be compared);
    ``error``: why the answer could not be compared, ``""`` if it could;
    ``passed``: within the thresholds and no error.
    """

    address: str
    version: int
    mean_gap: float
    max_gap: float
    passed: bool
    error: str = ""

    def reason(self, max_mean_gap: float) -> str:
        """Why the server is quarantined (its problem in the fleet metrics)."""
        if self.error:  # a server that cannot score at all: its error says why
            what = f"cannot check its log-probs at version {self.version}: {self.error}"
            if not self.error.startswith(_UNUSABLE):
                return f"log-prob parity: {what}"
        else:
            what = (f"log-probs differ from the learner's at version {self.version}: mean "
                    f"|gap| {self.mean_gap:.4g} nats, max {self.max_gap:.4g} "
                    f"(threshold {max_mean_gap:g})")
        return f"log-prob parity: {what}; {LIKELY_CAUSES}"


class ParityGate:
    """Reference log-probs by version, the verdict on servers' answers, and
    the latest result per server (module doc).

    Args:
      sequences: the probe set, token ids (``sao.fleet.probe.probe_sequences``).
      max_mean_gap: most mean per-token gap in nats a server may show (> 0).
      max_token_gap: most per-token gap in nats anywhere on the probe (> 0),
        or None (off).
      timeout_s: deadline of one ``Score`` rpc.
    Raises ValueError on an empty probe set, a sequence under 2 tokens, or
    thresholds that are not > 0.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], *, max_mean_gap: float = 0.1,
                 max_token_gap: float | None = None, timeout_s: float = 300.0):
        self.sequences = [[int(t) for t in s] for s in sequences]
        if not self.sequences or min(map(len, self.sequences)) < 2:
            raise ValueError("the probe set needs sequences of >= 2 tokens")
        if not max_mean_gap > 0 or (max_token_gap is not None and not max_token_gap > 0) \
                or not timeout_s > 0:
            raise ValueError(f"max_mean_gap ({max_mean_gap}), max_token_gap "
                             f"({max_token_gap}) and timeout_s ({timeout_s}) must be > 0")
        self.max_mean_gap, self.max_token_gap = float(max_mean_gap), max_token_gap
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._references: dict[int, list[np.ndarray]] = {}
        self.latest: dict[str, ParityResult] = {}  # address -> its last check
        self.checks = self.failures = self.unchecked = 0
        self.request = sao_pb2.ScoreRequest(sequences=[
            codec.encode_array(np.asarray(s, np.int32), np.dtype("<i4")) for s in self.sequences])

    # -- the learner's side ---------------------------------------------------
    def set_reference(self, version: int, logprobs: Sequence[np.ndarray]) -> None:
        """The learner's log-probs of the probe set at ``version`` (one
        f32[T_i] per sequence, as ``token_logprobs``). Raises ValueError on
        other shapes or a non-finite value."""
        ref = [np.asarray(lp, np.float32) for lp in logprobs]
        if [r.shape for r in ref] != [(len(s),) for s in self.sequences]:
            raise ValueError("reference log-probs do not match the probe set's shapes")
        if not all(np.isfinite(r).all() for r in ref):
            raise ValueError("reference log-probs are not finite")
        with self._lock:
            self._references[int(version)] = ref
            for old in sorted(self._references)[:-_KEEP_REFERENCES]:
                del self._references[old]

    def has_reference(self, version: int, *, count: bool = False) -> bool:
        """Whether the learner's log-probs at ``version`` are known; with
        ``count``, a miss counts in ``unchecked`` (a server left unchecked)."""
        with self._lock:
            known = int(version) in self._references
            self.unchecked += count and not known
            return known

    # -- a server's answer ----------------------------------------------------
    def judge(self, address: str, response: sao_pb2.ScoreResponse) -> ParityResult | None:
        """The verdict on a ``Score`` answer (recorded as the server's latest),
        or None when the learner has no reference for the version that
        scored (counted in ``unchecked``; the next push checks it). Never
        raises on the answer's content."""
        version = int(response.version)
        with self._lock:
            ref = self._references.get(version)
        if response.ok and ref is None:
            with self._lock:
                self.unchecked += 1
            return None
        error, mean, top = "", math.nan, math.nan
        if not response.ok:
            error = response.error or "Score failed"
        else:
            try:
                scored = [codec.decode_array(a, np.dtype("<f4")) for a in response.logprobs]
                gaps = token_gaps(ref, scored)
                values = np.concatenate([s[1:] for s in scored])
                if not np.isfinite(values).all() or (values > 1e-3).any():
                    raise ValueError("non-finite or positive log-probs")
                mean, top = float(gaps.mean()), float(gaps.max())
            except ValueError as e:  # CodecError included
                error = f"{_UNUSABLE}: {e}"
        passed = not error and mean <= self.max_mean_gap and (
            self.max_token_gap is None or top <= self.max_token_gap)
        return self._record(ParityResult(address, version, mean, top, passed, error))

    def failed_rpc(self, address: str, version: int, error: str) -> ParityResult:
        """Records a ``Score`` rpc that did not answer (``version``: the one
        the server was to hold) as a failed check."""
        return self._record(ParityResult(address, int(version), math.nan, math.nan, False,
                                         f"Score rpc failed: {error}"))

    def _record(self, result: ParityResult) -> ParityResult:
        with self._lock:
            self.latest[result.address] = result
            self.checks += 1
            self.failures += not result.passed
        if result.passed:
            log.info("worker %s passes the log-prob parity check at version %d: mean |gap| "
                     "%.3g, max %.3g", result.address, result.version, result.mean_gap,
                     result.max_gap)
        else:
            log.error("worker %s fails the log-prob parity check: %s", result.address,
                      result.reason(self.max_mean_gap))
        return result

    def snapshot(self) -> dict[str, float]:
        """Scalars for the run's records (``parity/...`` keys): ``checks``,
        ``failures``, ``unchecked`` and per server ``<address>/mean_gap``,
        ``<address>/max_gap``, ``<address>/version`` and ``<address>/passed``
        (1 or 0) of its latest check."""
        with self._lock:
            snap: dict[str, float] = {"checks": self.checks, "failures": self.failures,
                                      "unchecked": self.unchecked}
            for address, r in sorted(self.latest.items()):
                snap.update({f"{address}/mean_gap": r.mean_gap, f"{address}/max_gap": r.max_gap,
                             f"{address}/version": r.version, f"{address}/passed": int(r.passed)})
            return snap


# A Score rpc that failed for one of these reasons got no answer from a live
# engine (the worker is unreachable or the session ended): no verdict.
_NO_ANSWER = ("UNAVAILABLE", "CANCELLED", "not connected", "link closed")


def verify(gate: ParityGate, link, version: int,
           quarantine: Callable[[str, str], bool]) -> bool | None:
    """Checks the worker behind ``link`` (``WorkerLink``), which holds weights
    ``version``: it scores the probe set and ``gate`` judges the answer.

    Returns True when it may serve (passed, or the learner has no reference
    for the version), False when it failed: then ``quarantine(address,
    reason)`` (``Dispatcher.quarantine``) was called, None when there is no
    answer now (unreachable): the caller retries on reconnect.
    """
    if not gate.has_reference(version, count=True):
        return True
    response = link.score(gate.request, gate.timeout_s)
    if not response.ok and response.error.startswith(_NO_ANSWER):
        return None
    result = gate.judge(link.address, response)
    if result is None or result.passed:
        return True
    quarantine(link.address, result.reason(gate.max_mean_gap))
    return False


class ParityHooks:
    """The parity gate's half of ``sao.fleet.dispatcher.Dispatcher`` (mixed
    in): a joining worker is verified before it gets a lease, and each worker
    again after every weight load it acknowledges. Uses the dispatcher's
    ``config.parity`` (a ``ParityGate`` or None: no gate) and ``quarantine``."""

    def link_verified(self, link, weights_version: int | None) -> bool:
        """Whether a worker about to join with ``weights_version`` may serve
        (always without a gate or before any weights were pushed)."""
        gate = self.config.parity
        if gate is None or weights_version is None:
            return True
        return verify(gate, link, weights_version, self.quarantine) is True

    def _load_verified(self, link, version: int, uri: str) -> sao_pb2.UpdateWeightsResponse:
        """``link.update_weights(version, uri)`` (a push, in the push's thread
        pool), then, once the worker acknowledged the weights, its check: a
        failure quarantines it; no answer makes it reconnect, and it is
        checked again as it rejoins."""
        r = link.update_weights(version, uri)
        gate = self.config.parity
        if r.ok and gate is not None and verify(gate, link, r.version, self.quarantine) is None:
            link.reset()
        return r
