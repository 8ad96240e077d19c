"""Where a run's fleet credentials come from, and when they are required.

* Every run has a shared-secret token: ``ensure_token_file(workdir)`` writes a
  fresh random one to ``<workdir>/fleet.token`` (mode 0600) on the first start
  and returns the same file on a resume. Workers the run spawns read that file;
  workers on other machines get a copy of it (launchers; never the token on a
  command line, where ``ps`` shows it).
* ``read_token_file`` refuses a token file that others can read, or an empty one.
* ``load_security`` turns the configured paths (token file, TLS certificate,
  key, CA) into a ``sao.rpc.auth.Security``, checking each file exists.
* ``check_bind`` is the worker's rule: an address other machines can reach
  (anything but loopback) is served only with a token.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import stat

from sao.rpc.auth import Security

log = logging.getLogger(__name__)
TOKEN_FILE = "fleet.token"
TOKEN_BYTES = 32  # 256 random bits, URL-safe base64 in the file


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace stripped).

    Raises FileNotFoundError if it does not exist, PermissionError if its mode
    lets the group or others read or write it (``chmod 600``), ValueError if it
    holds no token.
    """
    mode = os.stat(path).st_mode
    if mode & 0o077:
        raise PermissionError(f"token file {path} has mode {stat.filemode(mode)}: others could "
                              f"read the fleet token; run chmod 600 {path}")
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def ensure_token_file(workdir: str) -> str:
    """Path of the run's token file, ``<workdir>/fleet.token``; creates it with
    a fresh random token (mode 0600) if absent, else reuses it (a resumed run
    keeps its token, so workers still running keep accepting it).

    Creation is atomic (a complete file appears or none). Raises what
    ``read_token_file`` raises for an existing file that is unsafe or empty.
    """
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, TOKEN_FILE)
    if os.path.exists(path):
        read_token_file(path)
        return path
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created it meanwhile
        except FileExistsError:
            read_token_file(path)
    finally:
        os.unlink(tmp)
    return path


def _existing(key: str, path: str) -> str | None:
    if not path:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key}: no file {path}")
    return path


def load_security(*, token_file: str, tls_cert: str = "", tls_key: str = "", tls_ca: str = "",
                  tls_server_name: str = "") -> Security:
    """``Security`` from configured paths ("" = not set; config keys
    ``rollout.token_file``, ``rollout.tls_cert``, ``rollout.tls_key``,
    ``rollout.tls_ca``, ``rollout.tls_server_name``).

    A worker uses the token, ``tls_cert`` and ``tls_key``; the learner the token,
    ``tls_ca`` and ``tls_server_name``. Raises ValueError without a token file
    (every run has one: ``ensure_token_file``) or with only one of
    ``tls_cert`` / ``tls_key``; FileNotFoundError naming the key of a missing
    file; what ``read_token_file`` raises.
    """
    if not token_file:
        raise ValueError("rollout.token_file is empty: every run needs a token "
                         "(sao.rpc.credentials.ensure_token_file writes one)")
    return Security(token=read_token_file(token_file),
                    tls_cert=_existing("rollout.tls_cert", tls_cert),
                    tls_key=_existing("rollout.tls_key", tls_key),
                    tls_ca=_existing("rollout.tls_ca", tls_ca),
                    tls_server_name=tls_server_name or None)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``,
    ``::1``, bracketed or not); False for anything else, host names included."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, security: Security) -> None:
    """Raises ValueError if a worker would serve ``host`` without a token while
    other machines can reach it (any non-loopback address, ``0.0.0.0`` and
    ``::`` included). Logs a warning for a token without TLS there: the token
    then crosses the network in clear text."""
    if is_loopback(host):
        return
    if not security.token:
        raise ValueError(f"refusing to serve {host!r} without a token: any process that can "
                         "reach it could load weights and run prompts; set rollout.token_file "
                         "(or bind 127.0.0.1)")
    if not security.tls_cert:
        log.warning("serving %s without TLS: the fleet token travels in clear text "
                    "(set rollout.tls_cert / rollout.tls_key)", host)
