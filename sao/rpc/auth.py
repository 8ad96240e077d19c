"""Shared-secret token and optional TLS for the learner <-> worker channel.

The token travels in gRPC metadata as ``authorization: Bearer <token>`` and
the worker compares it in constant time (``hmac.compare_digest``); a missing
or wrong token ends the call with ``UNAUTHENTICATED`` before any handler runs.
TLS is optional: the worker serves with a certificate/key pair, the learner
verifies it against a CA (for a self-signed certificate, the certificate
itself). Workers bind to 127.0.0.1 unless configured otherwise.

Message sizes: a worker receives only small messages (leases, weight-load
orders naming a location, status requests), at most ``MAX_REQUEST_BYTES``;
gRPC refuses a larger one from its length prefix (``RESOURCE_EXHAUSTED``)
before buffering it, so a caller without the token cannot make a worker hold
a large message while the token is checked (the interceptor sees the call
before its message, but the refusal of a unary call still reads it). The
worker also keeps HTTP/2's receive window at its 64 KiB default (no
bandwidth-delay probing, which grew it to megabytes per call while a refused
message kept arriving). Only the
learner receives large messages (trajectory batches, up to
``MAX_MESSAGE_BYTES``), and only from the workers it dialled.
"""
from __future__ import annotations

import dataclasses
import hmac
import pathlib

import grpc

METADATA_KEY = "authorization"
_PREFIX = "Bearer "
# Large trajectory batches (worker -> learner): raise gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# What a worker accepts (learner -> worker: leases, weight-load orders, status).
MAX_REQUEST_BYTES = 4 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Security:
    """Channel security settings shared by the worker and the dispatcher.

    Attributes:
      token: shared secret; empty string disables the check (loopback tests only).
      tls_cert: path of the worker's PEM certificate (server side).
      tls_key: path of the worker's PEM private key (server side).
      tls_ca: path of the PEM CA / self-signed certificate the dispatcher trusts.
      tls_server_name: host name to verify in the worker's certificate, when it
        differs from the address dialled.
    """

    token: str = ""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")


def call_metadata(security: Security) -> tuple[tuple[str, str], ...]:
    """Metadata to attach to every call (empty when no token is configured)."""
    return ((METADATA_KEY, _PREFIX + security.token),) if security.token else ()


def token_ok(metadata, expected: str) -> bool:
    """Constant-time check of the bearer token in ``metadata`` (key/value pairs)."""
    presented = ""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith(_PREFIX):
            presented = value[len(_PREFIX):]
    return hmac.compare_digest(presented.encode(), expected.encode())


def _abort_handler(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` (unary for an unknown method)
    that ends the call with UNAUTHENTICATED before reading anything else."""
    async def deny(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid token")

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(deny)

    if handler.request_streaming and handler.response_streaming:
        async def deny_stream(it, context):
            await deny(it, context)
            yield  # pragma: no cover - abort raises before this
        return grpc.stream_stream_rpc_method_handler(deny_stream)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        async def deny_unary_stream(req, context):
            await deny(req, context)
            yield  # pragma: no cover
        return grpc.unary_stream_rpc_method_handler(deny_unary_stream)
    return grpc.unary_unary_rpc_method_handler(deny)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls whose bearer token is missing or wrong (asyncio server)."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("TokenInterceptor needs a non-empty token")
        self._token = token

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if token_ok(handler_call_details.invocation_metadata, self._token):
            return handler
        # Unknown methods are refused the same way, so a caller without the
        # token cannot probe which methods exist (UNIMPLEMENTED would tell).
        return _abort_handler(handler)


def _read(path: str | None) -> bytes | None:
    return None if path is None else pathlib.Path(path).read_bytes()


# HTTP/2 keepalive: a worker whose machine vanished without closing its TCP
# connection is noticed within ~KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS and its
# leases are re-issued. The server accepts pings at that rate.
KEEPALIVE_MS = 20_000
KEEPALIVE_TIMEOUT_MS = 10_000


def server_options() -> list[tuple[str, int]]:
    """A worker's: sends up to ``MAX_MESSAGE_BYTES``, receives up to ``MAX_REQUEST_BYTES``."""
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
            ("grpc.http2.max_ping_strikes", 0),
            ("grpc.http2.bdp_probe", 0)]


def channel_options(security: Security) -> list[tuple[str, object]]:
    """The learner's: sends up to ``MAX_REQUEST_BYTES``, receives up to ``MAX_MESSAGE_BYTES``."""
    opts: list[tuple[str, object]] = [
        ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1)]
    if security.tls_server_name:
        opts.append(("grpc.ssl_target_name_override", security.tls_server_name))
    return opts


def add_port(server: grpc.aio.Server, address: str, security: Security) -> int:
    """Binds ``address`` (TLS when a certificate is configured); returns the port."""
    if security.tls_cert:
        creds = grpc.ssl_server_credentials([(_read(security.tls_key), _read(security.tls_cert))])
        return server.add_secure_port(address, creds)
    return server.add_insecure_port(address)


def open_channel(target: str, security: Security) -> grpc.Channel:
    """A blocking-API channel to a worker (TLS when ``tls_ca`` is configured)."""
    if security.tls_ca:
        creds = grpc.ssl_channel_credentials(root_certificates=_read(security.tls_ca))
        return grpc.secure_channel(target, creds, options=channel_options(security))
    return grpc.insecure_channel(target, options=channel_options(security))
