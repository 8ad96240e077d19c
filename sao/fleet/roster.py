"""Which workers cannot serve the dispatcher now, and why.

Four kinds: a worker quarantined by the dispatcher (``sao.fleet.health``:
a missed lease timeout, weights ahead of the learner's) is unusable for good;
a worker that refused the credentials (``UNAUTHENTICATED`` /
``PERMISSION_DENIED``) is unusable for good; so is a broken one (its engine
gave up, or its weight loads kept failing: ``sao.fleet.link``), and more than
the tolerated number of broken workers is a ``FleetError`` naming them; one
holding weights newer than the learner's version (left over from a run that
got further; engines refuse to load older weights) is unusable until the
learner's published version reaches its own. Not thread-safe: the
dispatcher calls it under its lock.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from sao.fleet.dispatch_config import FleetError

log = logging.getLogger(__name__)


class Roster:
    """Unusable workers by address with the reason for each."""

    def __init__(self):
        self.unusable: dict[str, str] = {}  # address -> why it cannot serve now
        self.rejected: set[str] = set()     # addresses that refused the credentials
        self.broken: dict[str, str] = {}    # address -> why it cannot serve again
        self.quarantined: set[str] = set()  # addresses the dispatcher stopped using

    def break_worker(self, address: str, error: str) -> str:
        """The worker cannot serve again (``error``); returns the reason kept."""
        self.broken[address] = self.unusable[address] = f"broken ({error})"
        log.error("worker %s is broken: %s", address, error)
        return self.unusable[address]

    def quarantine(self, address: str, reason: str) -> str:
        """The dispatcher stopped using the worker (``reason``); returns the reason kept."""
        self.quarantined.add(address)
        self.unusable[address] = f"quarantined ({reason})"
        return self.unusable[address]

    def permanent(self, address: str) -> bool:
        """Unusable for good: rejected the credentials, broken, or quarantined."""
        return address in self.rejected or address in self.broken or address in self.quarantined

    def raise_if_broken(self, max_broken: int) -> None:
        """Raises ``FleetError`` naming every broken worker when more than
        ``max_broken`` are."""
        if len(self.broken) > max_broken:
            detail = "; ".join(f"{a}: {r}" for a, r in self.broken.items())
            raise FleetError(f"{len(self.broken)} rollout worker(s) broken (at most "
                             f"{max_broken} tolerated): {detail}")

    def reject(self, address: str, error: str) -> str:
        """The worker refused the credentials (``error``); returns the reason kept."""
        self.rejected.add(address)
        self.unusable[address] = f"rejected the credentials ({error})"
        return self.unusable[address]

    def check(self, address: str, worker_version: int, learner_version: int) -> str | None:
        """Why the worker holding ``worker_version`` cannot serve a learner at
        ``learner_version`` (kept and logged once), or None (and any earlier
        version reason is cleared)."""
        if worker_version <= learner_version:
            if not self.permanent(address):
                self.unusable.pop(address, None)
            return None
        reason = (f"worker holds weights version {worker_version}, newer than the learner "
                  f"version {learner_version} (engines refuse older weights): every "
                  "trajectory would be a future_version drop; restart the worker, or "
                  "set DispatcherConfig.initial_version to the learner's version")
        if self.unusable.get(address) != reason:
            log.warning("worker %s unusable: %s", address, reason)
        self.unusable[address] = reason
        return reason

    def caught_up(self, learner_version: int, version_of: Callable[[str], int]) -> list[str]:
        """Clears (and returns) the workers that were ahead of the learner and
        no longer are; each rejoins on its link's next reconnect."""
        cleared = [a for a in self.unusable
                   if not self.permanent(a) and version_of(a) <= learner_version]
        for address in cleared:
            del self.unusable[address]
        return cleared

    def raise_if_none_usable(self, addresses: Iterable[str], any_live: bool) -> None:
        """Raises ``FleetError`` when no worker is live and every one of
        ``addresses`` is unusable (the message names each reason)."""
        addresses = list(addresses)
        if any_live or not addresses or not all(a in self.unusable for a in addresses):
            return
        detail = "; ".join(f"{a}: {self.unusable[a]}" for a in addresses)
        if all(a in self.rejected for a in addresses):
            raise FleetError(f"all workers rejected the credentials: {detail}")
        raise FleetError(f"no usable worker: {detail}")
