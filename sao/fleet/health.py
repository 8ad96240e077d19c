"""Unhealthy workers: the dispatcher's quarantine (mixed into ``Dispatcher``).

A quarantined worker is marked unhealthy for the rest of the run: it gets no
more leases, its outstanding leases are cancelled on it and their prompts
issued again to the others (ahead of fresh ones), its link stops without
reconnecting, and its later answers are dropped (``quarantined``). The
dispatcher quarantines a worker that holds a lease past
``DispatcherConfig.lease_timeout_s`` (hung, or far too slow: ``_expire_overdue``)
and one that reports weights newer than the learner's (someone else pushed
them, so its version label cannot be trusted: ``_check_version``, counted as
``version_ahead``). Any other check may call ``Dispatcher.quarantine(address,
reason)``, e.g. a gate comparing a server's log-probs with the learner's.

The methods run on the ``Dispatcher``'s attributes (``_cv``, ``_links``,
``_live``, ``_book``, ``_jobs``, ``_roster``, ``metrics``, ``_quarantined``);
those starting with ``_`` hold its lock.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sao.fleet.link import WorkerLink

log = logging.getLogger(__name__)


class Health:
    """The quarantine half of ``sao.fleet.dispatcher.Dispatcher`` (module doc)."""

    def quarantine(self, address: str, reason: str) -> bool:
        """Marks the worker at ``address`` unhealthy for the rest of the run:
        it gets no more leases, its outstanding leases are cancelled on it and
        their prompts issued again to the other workers (ahead of fresh ones),
        and its later answers are dropped (``quarantined``). ``reason`` is
        kept (``snapshot()["workers"][address]["problem"]``) and logged;
        ``snapshot()["quarantined"]`` counts quarantines. Used for a missed
        lease timeout and for weights ahead of the learner's; any other check
        (e.g. a log-prob parity gate) may call it too. Thread-safe; returns
        False when the worker is unknown or already quarantined. With every
        worker quarantined, ``get_batch`` raises ``FleetError``."""
        with self._cv:
            link = self._links.get(address)
            return link is not None and self._quarantine(link, reason)

    def _quarantine(self, link: WorkerLink, reason: str) -> bool:
        if link in self._quarantined:
            return False
        self._quarantined.add(link)
        log.error("worker %s quarantined: %s; its prompts are issued again", link.address, reason)
        self._live.pop(link, None)
        stats = self.metrics.worker(link.address)
        stats.live, stats.problem = False, self._roster.quarantine(link.address, reason)
        self.metrics.quarantined += 1
        withdrawn = self._book.withdraw_link(link)
        for job in self._jobs:
            withdrawn += job.book.withdraw_link(link)
        self._cancel(withdrawn)
        self.metrics.reissued += self._book.requeue_withdrawn(withdrawn)
        for job in self._jobs:
            job.book.requeue_withdrawn(withdrawn)
        link.retire()  # ends its stream; the link thread stops without reconnecting
        self._schedule()
        self._cv.notify_all()
        return True

    def _check_version(self, link: WorkerLink, version: int) -> None:
        """A worker reporting weights newer than the learner's was pushed them
        by someone else: its version label cannot be trusted, so it is quarantined."""
        if version > self._version and link not in self._quarantined:
            self.metrics.version_ahead += 1
            self._quarantine(link, f"reports weights version {version}, ahead of the learner "
                                   f"version {self._version}")

    def _expire_overdue(self) -> None:
        """Quarantines every worker holding a lease older than ``lease_timeout_s``."""
        timeout = self.config.lease_timeout_s
        if timeout is None:
            return
        late = self._book.overdue_links(timeout)
        for job in self._jobs:
            late |= job.book.overdue_links(timeout)
        for link in sorted(late, key=lambda l: l.address):
            self._quarantine(link, f"held a lease past lease_timeout_s={timeout:g}")
