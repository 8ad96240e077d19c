"""One learner-side connection to a rollout worker, kept alive by a thread.

A ``WorkerLink`` connects, asks ``Status`` (capacity, version), brings the
worker's weights up to the learner's latest published version, then holds
one ``Generate`` stream open: leases go out through a queue, finished
trajectories come back and are handed to the owner (the dispatcher). When the
stream breaks (worker killed, network) the owner is told so it can re-issue
the worker's leases, and the link reconnects every ``reconnect_s`` until
closed, so a restarted worker on the same address rejoins by itself.

A worker that refuses the credentials (``UNAUTHENTICATED`` /
``PERMISSION_DENIED``) is not retried: the link tells the owner
(``link_rejected``) and stops. Neither is a broken worker: one whose
``Status`` says its engine gave up (``unusable``), or one that failed
``max_weight_failures`` weight loads in a row (a push or a sync, each bounded
by ``weights_timeout_s``): the link tells the owner (``link_broken``) and
stops, so a worker that refuses every push costs at most
``max_weight_failures x (weights_timeout_s + reconnect_s)`` instead of being
retried forever. A worker the owner cannot use yet
(``link_usable`` returns a reason, e.g. it holds weights newer than the
learner and nothing was published to bring it in line) is told to the owner
and retried every ``reconnect_s``. Before it joins, a worker holding the
learner's latest weights is verified by the owner (``link_verified``: the
log-prob parity gate, ``sao.fleet.parity``); one without a verdict now is
retried every ``reconnect_s``.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

import grpc

from sao.rpc import auth, sao_pb2, sao_pb2_grpc

log = logging.getLogger(__name__)
_POLL_S = 0.1
_FATAL_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class _Unusable(Exception):
    """The worker answered but the owner cannot use it (yet)."""


class _LoadFailed(Exception):
    """The worker could not load the latest weights (retried on reconnect)."""


class _Broken(Exception):
    """The worker cannot serve again (its engine gave up, or its loads keep failing)."""


class LinkOwner(Protocol):
    def latest_weights(self) -> tuple[int, str] | None: ...
    def link_joined(self, link: "WorkerLink", capacity: int, weights_version: int | None) -> bool: ...
    def link_response(self, link: "WorkerLink", response: sao_pb2.GenerateResponse) -> None: ...
    def link_lost(self, link: "WorkerLink", error: str) -> None: ...
    def link_rejected(self, link: "WorkerLink", error: str) -> None: ...
    def link_broken(self, link: "WorkerLink", error: str) -> None: ...
    def link_usable(self, link: "WorkerLink", worker_version: int) -> str | None: ...
    def link_verified(self, link: "WorkerLink", weights_version: int | None) -> bool: ...


class WorkerLink:
    """Connection to the worker at ``address`` (``host:port``).

    ``rpc_timeout_s`` bounds ``Status``; ``weights_timeout_s`` one
    ``UpdateWeights`` (a server restart can take minutes; default
    ``rpc_timeout_s``); ``max_weight_failures`` failed loads in a row make the
    link give up (``link_broken``). Raises ValueError if it is < 1.
    """

    def __init__(self, address: str, owner: LinkOwner, security: auth.Security, *,
                 capacity: int | None, reconnect_s: float, rpc_timeout_s: float,
                 weights_timeout_s: float | None = None, max_weight_failures: int = 3):
        if max_weight_failures < 1:
            raise ValueError(f"max_weight_failures must be >= 1, got {max_weight_failures}")
        self.address = address
        self._owner = owner
        self._security = security
        self._metadata = auth.call_metadata(security)
        self._capacity = capacity
        self._reconnect_s = reconnect_s
        self._rpc_timeout_s = rpc_timeout_s
        self._weights_timeout_s = weights_timeout_s or rpc_timeout_s
        self._max_weight_failures = max_weight_failures
        self._weight_failures = 0          # in a row, pushes and syncs alike
        self._broken: str | None = None    # why the link gave up, once it has
        self._closed = threading.Event()
        self._sendq: queue.Queue | None = None
        self._call = None
        self._stub: sao_pb2_grpc.RolloutWorkerStub | None = None
        self._thread = threading.Thread(target=self._run, name=f"link-{address}", daemon=True)

    # -- owner side -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._closed.set()
        self.reset()
        self._thread.join(timeout)

    def retire(self) -> None:
        """Like ``close`` without waiting: ends the stream, never reconnects
        (safe under the owner's lock, from any thread)."""
        self._closed.set()
        self.reset()

    def send(self, request: sao_pb2.GenerateRequest) -> None:
        """Queues a request on the current stream (dropped if none: the owner
        re-issues leases of a lost link anyway)."""
        q = self._sendq
        if q is not None:
            q.put(request)

    def reset(self) -> None:
        """Ends the current stream; the link reconnects unless closed."""
        call, q = self._call, self._sendq
        if q is not None:
            q.put(None)
        if call is not None:
            call.cancel()

    def update_weights(self, version: int, uri: str) -> sao_pb2.UpdateWeightsResponse:
        """Blocking ``UpdateWeights``; RPC failures come back as a not-ok value
        (and count towards ``max_weight_failures``); a session that ends during
        the call comes back as not-ok ``"link closed"`` and counts for nothing."""
        stub = self._stub
        if stub is None:
            return sao_pb2.UpdateWeightsResponse(ok=False, version=-1, error="not connected")
        try:
            r = stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=version, uri=uri),
                                   timeout=self._weights_timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            r = sao_pb2.UpdateWeightsResponse(ok=False, version=-1,
                                              error=f"{e.code().name}: {e.details()}")
        except ValueError:  # the session ended (its channel closed) while we called:
            # not the worker's failure; the next session syncs the weights first
            return sao_pb2.UpdateWeightsResponse(ok=False, version=-1, error="link closed")
        self._weights_result(r)
        return r

    def score(self, request: sao_pb2.ScoreRequest, timeout_s: float) -> sao_pb2.ScoreResponse:
        """Blocking ``Score`` (the parity gate's probe, ``sao.fleet.parity``);
        an rpc failure comes back as a not-ok value whose error starts with
        the status code name (``"not connected"`` / ``"link closed"`` when
        there is no session)."""
        stub = self._stub
        if stub is None:
            return sao_pb2.ScoreResponse(ok=False, version=-1, error="not connected")
        try:
            return stub.Score(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            return sao_pb2.ScoreResponse(ok=False, version=-1,
                                         error=f"{e.code().name}: {e.details()}")
        except ValueError:  # the session's channel closed during the call
            return sao_pb2.ScoreResponse(ok=False, version=-1, error="link closed")

    def _weights_result(self, r: sao_pb2.UpdateWeightsResponse) -> None:
        """Counts failed loads in a row; at ``max_weight_failures`` the link is broken."""
        if r.ok:
            self._weight_failures = 0
            return
        self._weight_failures += 1
        if self._weight_failures >= self._max_weight_failures and self._broken is None:
            self._broken = (f"{self._weight_failures} weight loads failed in a row, "
                            f"the last: {r.error}")

    # -- thread -----------------------------------------------------------
    def _requests(self, q: queue.Queue):
        while True:
            try:
                item = q.get(timeout=_POLL_S)
            except queue.Empty:
                if self._closed.is_set():
                    return
                continue
            if item is None:
                return
            yield item

    def _run(self) -> None:
        while not self._closed.is_set():
            error = ""
            joined = fatal = False
            try:
                joined = self._session()
            except grpc.RpcError as e:
                error = f"{e.code().name}: {e.details()}"
                if e.code() in _FATAL_CODES:
                    fatal = True
            except (_Unusable, _Broken, _LoadFailed) as e:
                error = str(e)
                log.warning("worker %s: %s", self.address, error)
            except Exception as e:  # keep the link alive whatever happened
                log.exception("link %s failed", self.address)
                error = f"{type(e).__name__}: {e}"
            finally:
                if self._sendq is not None:
                    self._sendq.put(None)
                self._sendq, self._call, self._stub = None, None, None
            if joined or error:
                self._owner.link_lost(self, error or "stream ended")
            if fatal:  # retrying cannot help: wrong token or not allowed
                log.error("worker %s rejected the credentials (%s); not retrying it",
                          self.address, error)
                self._owner.link_rejected(self, error)
                return
            if self._broken is not None:  # retrying cannot help either
                log.error("worker %s is broken (%s); not retrying it", self.address, self._broken)
                self._owner.link_broken(self, self._broken)
                return
            self._closed.wait(self._reconnect_s)

    def _sync_weights(self, stub, have: int) -> int | None:
        """Pushes the latest weights until the worker holds them; returns the version."""
        while True:
            latest = self._owner.latest_weights()
            if latest is None or latest[0] == have:
                return None if latest is None else have
            try:
                r = stub.UpdateWeights(sao_pb2.UpdateWeightsRequest(version=latest[0],
                                                                    uri=latest[1]),
                                       timeout=self._weights_timeout_s, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() in _FATAL_CODES:
                    raise
                r = sao_pb2.UpdateWeightsResponse(ok=False, version=-1,
                                                  error=f"{e.code().name}: {e.details()}")
            self._weights_result(r)
            if not r.ok:
                raise _LoadFailed(f"cannot load weights version {latest[0]}: {r.error}")
            have = r.version

    def _session(self) -> bool:
        with auth.open_channel(self.address, self._security) as channel:
            stub = sao_pb2_grpc.RolloutWorkerStub(channel)
            status = stub.Status(sao_pb2.StatusRequest(), timeout=self._rpc_timeout_s,
                                 metadata=self._metadata)
            if status.unusable:
                self._broken = f"worker reports itself unusable: {status.unusable}"
                raise _Broken(self._broken)
            capacity = status.max_concurrency
            if self._capacity is not None:
                capacity = min(capacity, self._capacity)
            version = status.version
            problem = self._owner.link_usable(self, version)
            if problem is not None:
                raise _Unusable(problem)
            self._stub = stub
            q: queue.Queue = queue.Queue()
            self._sendq = q
            while True:  # the learner may publish while we sync: retry until current
                if self._closed.is_set():  # closed or retired meanwhile
                    return False
                synced = self._sync_weights(stub, version)
                if synced is not None:
                    version = synced
                if not self._owner.link_verified(self, synced):  # e.g. the parity gate
                    raise _Unusable(f"not verified at weights version {synced}")
                if self._owner.link_joined(self, capacity, synced):
                    break
            if self._closed.is_set():
                return True
            self._call = stub.Generate(self._requests(q), metadata=self._metadata)
            for response in self._call:
                self._owner.link_response(self, response)
            return True
