"""The dispatcher's settings (``DispatcherConfig``) and its one error type."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sao.fleet import staleness
from sao.rpc import auth
from sao.types import MIN_ROLLOUT_LOGPROB

if TYPE_CHECKING:
    from sao.fleet.parity import ParityGate


class FleetError(RuntimeError):
    """No worker of the fleet can serve this dispatcher (credentials, versions),
    or more than ``max_broken_workers`` workers broke (the message names them)."""


@dataclasses.dataclass(frozen=True)
class DispatcherConfig:
    """Dispatch settings.

    Attributes:
      batch_size: B, trajectories per learner batch.
      vocab_size: ids at or above it are rejected (``bad_token_id``).
      tau: staleness bound in versions (docs/algorithm.md §6; 0 = synchronous RL).
      max_in_flight: prompts in flight + buffered; default ``(tau+1)*batch_size``.
      capacity_per_worker: leases per worker; default the worker's
        ``max_concurrency``.
      max_attempts: issues of a prompt whose episode failed before giving up.
      lease_timeout_s: a worker holding a lease this long is quarantined and
        its prompts issued again to the others (``sao.fleet.health``). The
        default, 600 s, is far above any episode of the repository's
        experiments and below their batch timeouts; None: never (a hung
        worker then holds its prompts until the batch timeout).
      initial_version: learner version before the first ``push_weights``.
      reconnect_s: seconds between reconnection attempts to a lost worker.
      rpc_timeout_s: deadline of ``Status``.
      weights_timeout_s: deadline of one ``UpdateWeights`` (a worker that
        restarts its server to load weights may need minutes).
      max_weight_failures: weight loads failing in a row (pushes and syncs)
        after which a worker is broken and no longer retried.
      max_broken_workers: broken workers (engine gave up, loads kept failing;
        ``sao.fleet.link``) tolerated; one more and ``get_batch`` /
        ``push_weights`` / ``sample`` raise ``FleetError`` naming them.
      parity: the log-prob parity gate (``sao.fleet.parity.ParityGate``):
        every worker is checked as it joins and after each weight load, and
        quarantined when it disagrees with the learner. None: no check.
      security: token / TLS (``sao.rpc.auth.Security``).
      max_length: longer trajectories are rejected (``too_long``); the learner's
        largest length bucket. None: unbounded (the learner may then fail to pad).
      max_abs_reward: rewards with a larger ``|r|`` are rejected (``reward_out_of_range``).
      min_rollout_logprob: action tokens with a smaller rollout log-prob are
        rejected (``logprob_out_of_range``; ``sao.types.MIN_ROLLOUT_LOGPROB``).

    Raises ValueError from ``__post_init__`` on a bad batch size, tau, vocab
    size, attempt count, length or reward bound, or a budget below one batch.
    """

    batch_size: int
    vocab_size: int
    tau: int = 4
    max_in_flight: int | None = None
    capacity_per_worker: int | None = None
    max_attempts: int = 3
    lease_timeout_s: float | None = 600.0
    initial_version: int = 0
    reconnect_s: float = 0.25
    rpc_timeout_s: float = 60.0
    weights_timeout_s: float = 900.0
    max_weight_failures: int = 3
    max_broken_workers: int = 0
    parity: ParityGate | None = None
    security: auth.Security = auth.Security()
    max_length: int | None = None
    max_abs_reward: float | None = 1e6
    min_rollout_logprob: float | None = MIN_ROLLOUT_LOGPROB

    def __post_init__(self):
        staleness.max_in_flight(self.batch_size, self.tau)  # validates both
        if min(self.vocab_size, self.max_attempts,
               1 if self.max_length is None else self.max_length) < 1:
            raise ValueError("vocab_size, max_attempts and max_length (if set) must be >= 1")
        if self.max_abs_reward is not None and not self.max_abs_reward > 0:
            raise ValueError(f"max_abs_reward must be > 0, got {self.max_abs_reward}")
        if min(self.max_weight_failures, self.max_broken_workers + 1) < 1 or \
                not self.weights_timeout_s > 0:
            raise ValueError("max_weight_failures must be >= 1, max_broken_workers >= 0 and "
                             "weights_timeout_s > 0")
        if self.lease_timeout_s is not None and not self.lease_timeout_s > 0:
            raise ValueError(f"lease_timeout_s must be > 0 or None, got {self.lease_timeout_s}")
        if self.min_rollout_logprob is not None and not self.min_rollout_logprob < 0:
            raise ValueError(f"min_rollout_logprob must be < 0, got {self.min_rollout_logprob}")
        if self.max_in_flight is not None and self.max_in_flight < self.batch_size:
            raise ValueError(f"max_in_flight ({self.max_in_flight}) < batch_size")

    @property
    def budget(self) -> int:
        """Prompts in flight + trajectories buffered allowed at once."""
        return self.max_in_flight or staleness.max_in_flight(self.batch_size, self.tau)
