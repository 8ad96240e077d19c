"""Per-run token file, security from configured paths, the worker's bind rule."""
import logging
import os
import stat

import pytest

from sao.fleet import sim
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig
from sao.rpc import auth, credentials


def test_token_file_is_private_random_and_reused_on_resume(tmp_path):
    path = credentials.ensure_token_file(str(tmp_path / "run"))
    assert path == str(tmp_path / "run" / "fleet.token")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token = credentials.read_token_file(path)
    assert len(token) >= 40  # 32 random bytes, URL-safe base64
    assert credentials.ensure_token_file(str(tmp_path / "run")) == path  # resume: same file
    assert credentials.read_token_file(path) == token
    other = credentials.read_token_file(credentials.ensure_token_file(str(tmp_path / "run2")))
    assert other != token
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["fleet.token"]  # no temporaries


def test_token_file_others_can_read_is_refused(tmp_path):
    path = credentials.ensure_token_file(str(tmp_path))
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        credentials.read_token_file(path)
    with pytest.raises(PermissionError):
        credentials.ensure_token_file(str(tmp_path))  # a resume does not reuse it silently


def test_empty_token_file_is_refused(tmp_path):
    path = tmp_path / "t"
    path.write_text("  \n")
    path.chmod(0o600)
    with pytest.raises(ValueError, match="empty"):
        credentials.read_token_file(str(path))


def test_load_security_from_configured_paths(tmp_path):
    token_file = credentials.ensure_token_file(str(tmp_path))
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("cert")
    key.write_text("key")
    sec = credentials.load_security(token_file=token_file, tls_cert=str(cert), tls_key=str(key),
                                    tls_ca=str(cert), tls_server_name="worker0")
    assert sec == auth.Security(token=credentials.read_token_file(token_file), tls_cert=str(cert),
                                tls_key=str(key), tls_ca=str(cert), tls_server_name="worker0")
    assert credentials.load_security(token_file=token_file).tls_cert is None
    with pytest.raises(ValueError, match="every run needs a token"):
        credentials.load_security(token_file="")
    with pytest.raises(FileNotFoundError, match="rollout.tls_ca"):
        credentials.load_security(token_file=token_file, tls_ca=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="together"):
        credentials.load_security(token_file=token_file, tls_cert=str(cert))


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("localhost", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.2", False),
    ("worker-3.cluster", False)])
def test_is_loopback(host, loopback):
    assert credentials.is_loopback(host) is loopback


def test_check_bind(caplog):
    credentials.check_bind("127.0.0.1", auth.Security())
    with pytest.raises(ValueError, match="without a token"):
        credentials.check_bind("0.0.0.0", auth.Security())
    with caplog.at_level(logging.WARNING, logger="sao.rpc.credentials"):
        credentials.check_bind("0.0.0.0", auth.Security(token="t"))
    assert "clear text" in caplog.text


def _sim():
    engine = sim.SimulatedEngine(seconds_per_token=1e-4)
    return engine, sim.make_sim_episode_fn(engine)


def test_worker_refuses_all_interfaces_without_a_token():
    # Launchers used to start workers on 0.0.0.0 with no token: anyone on the
    # network could load weights into them and run prompts.
    with pytest.raises(ValueError, match="without a token"):
        ThreadedWorker(_sim, WorkerConfig(host="0.0.0.0"))
    with ThreadedWorker(_sim, WorkerConfig(host="0.0.0.0",
                                           security=auth.Security(token="t"))) as w:
        assert w.address.startswith("0.0.0.0:")
