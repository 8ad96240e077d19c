"""A rollout worker's SGLang engine from the config (sao/sglang_setup.py).

The worker process (``sao.main --role=rollout``) starts its own server from
``rollout.sglang`` with the learner's first weights, restarts it on each push
(``reload="restart"``, the sglang-jax way), reports itself unusable once its
loads keep failing (the learner then raises ``FleetError`` naming it) and
stops its server when it exits. The server is the stand-in
``tests/rollout/fake_sglang_server.py``; the real servers run in
tests/launch/test_cluster_runs.py (both kinds) and tests/rollout/test_sglang_real_server.py
(``--attach``). Attaching by URL reads
``rollout.sglang.url_file``.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import ml_collections
import numpy as np
import pytest

from experiments import sao_math
from sao import components, sglang_setup
from sao.ckpt import publish
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig, FleetError
from sao.rollout.sglang_server import SGLangServer
from sao.rpc import credentials
from sao.rpc.auth import Security

REPO = pathlib.Path(__file__).resolve().parents[1]
FAKE_DIR = REPO / "tests" / "rollout"


def config(**sglang):
    cfg = sao_math.get_config("cpu")
    cfg.unlock()
    cfg.rollout.engine = "sglang"
    cfg.rollout.sglang.update(sglang)
    return cfg


def test_reload_mode_defaults_and_checks():
    assert sglang_setup.reload_mode(config(python="py", module="sgl_jax.launch_server")) == "restart"
    assert sglang_setup.reload_mode(config(python="py")) == "update_weights_from_disk"
    assert sglang_setup.reload_mode(config(module="sgl_jax.launch_server")) == \
        "update_weights_from_disk"  # attached: nothing to restart
    with pytest.raises(ValueError, match="reload must be one of"):
        sglang_setup.reload_mode(config(reload="reboot"))


def test_parse_env():
    assert sglang_setup.parse_env("A=1 B='x y' C=") == {"A": "1", "B": "x y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        sglang_setup.parse_env("A=1 B")


def test_attached_workers_read_the_url_file(tmp_path):
    urls = tmp_path / "urls"
    urls.write_text("# servers\nhttp://h0:30000\n\nhttp://h1:30001\n")
    cfg = config(url_file=str(urls))
    e1 = components.make_engine(cfg, seed=0, worker_index=1)
    assert e1.base_url == "http://h1:30001" and e1.server is None
    assert e1.reload == "update_weights_from_disk"
    assert components.make_engine(cfg, seed=0, sglang_url="http://x:1").base_url == "http://x:1"
    with pytest.raises(ValueError, match="lists 2 SGLang URLs; worker 2 has none"):
        components.make_engine(cfg, seed=0, worker_index=2)
    with pytest.raises(ValueError, match="needs a server"):
        components.make_engine(config(), seed=0)
    with pytest.raises(ValueError, match="not the learner's model"):
        components.make_engine(cfg, seed=0, model=object())


def test_started_server_command():
    cfg = config(python="/env/bin/python", module="sgl_jax.launch_server", port=31000,
                 args="--device cpu --dtype float32", env="A=1", python_path="/x:/y",
                 max_reload_failures=5)
    engine = components.make_engine(cfg, seed=0, worker_index=2, log_dir="/logs")
    server = engine.server
    assert engine.reload == "restart" and engine.owns_server and engine.max_reload_failures == 5
    assert server.port == 31002 and server.log_path == "/logs/sglang2.log"
    assert server.command()[:3] == ["/env/bin/python", "-m", "sgl_jax.launch_server"]
    assert server.command()[-4:] == ["--device", "cpu", "--dtype", "float32"]
    assert server.environment()["A"] == "1"
    assert server.environment()["PYTHONPATH"].startswith("/x:/y")
    # sglang-jax restarts on each reload: XLA's persistent cache survives them (env overrides it).
    assert server.environment()["JAX_COMPILATION_CACHE_DIR"].endswith("sglang-jax-xla")
    cfg.rollout.sglang.env = "JAX_COMPILATION_CACHE_DIR=/c"
    assert sglang_setup.make_server(cfg, 0).environment()["JAX_COMPILATION_CACHE_DIR"] == "/c"
    assert not server.running()  # started by the first weight load


def test_a_server_started_from_a_short_lived_thread_outlives_it(tmp_path):
    """The parent-death signal follows the thread that forked: a server started from a
    thread that then ends (asyncio.to_thread in a loop that closes, a pool shut down)
    was killed with that thread; it must live until it is stopped or this process dies."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    server = SGLangServer(str(model), python=sys.executable, module="fake_sglang_server",
                          args=(), python_path=[str(FAKE_DIR)], log_path=str(tmp_path / "s.log"),
                          ready_timeout_s=60)
    assert server.launch_argv()[0].endswith("setpriv")   # the parent-death signal is armed
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    try:
        time.sleep(1.0)                                    # the signal comes at once if at all
        assert server.running() and _alive(server.proc.pid), server.log_tail()
    finally:
        server.stop()
    assert not server.running()


def test_a_niced_server_runs_at_its_niceness(tmp_path):
    """``nice`` (launch/sglang_fleet.py sets 10 for sglang-jax on CPU, whose idle scheduler
    polls in a loop): the server process itself runs at that niceness, still under the
    parent-death signal; a niceness outside 0-19 is refused."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    server = SGLangServer(str(model), python=sys.executable, module="fake_sglang_server",
                          args=(), python_path=[str(FAKE_DIR)], log_path=str(tmp_path / "s.log"),
                          ready_timeout_s=60, nice=7)
    assert server.launch_argv()[0].endswith("setpriv")
    server.start()
    try:
        with open(f"/proc/{server.proc.pid}/stat") as f:
            fields = f.read().split(")")[-1].split()
        assert int(fields[16]) == os.nice(0) + 7 or int(fields[16]) == 19, fields  # field 19: nice
    finally:
        server.stop()
    for bad in (-1, 20, 1.5):
        with pytest.raises(ValueError, match="nice"):
            SGLangServer(str(model), python=sys.executable, nice=bad)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.slow
def test_worker_starts_restarts_gives_up_and_stops_its_server(tmp_path):
    workdir, events = tmp_path / "run", tmp_path / "events.jsonl"
    token = credentials.read_token_file(credentials.ensure_token_file(str(workdir)))
    addr = tmp_path / "worker.addr"
    sets = {"rollout.engine": "sglang", "rollout.sglang.python": sys.executable,
            "rollout.sglang.module": "fake_sglang_server", "rollout.sglang.args": "--no-update",
            "rollout.sglang.python_path": str(FAKE_DIR), "rollout.sglang.reload": "restart",
            "rollout.sglang.max_reload_failures": "2", "rollout.sglang.ready_timeout_s": "60"}
    argv = [sys.executable, "-m", "sao.main", "--config=experiments/sao_math.py:cpu",
            f"--workdir={workdir}", "--role=rollout", f"--address_file={addr}",
            *[f"--config.{k}={v}" for k, v in sets.items()]]
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "FAKE_SGLANG_EVENTS": str(events)})
    try:
        deadline = time.monotonic() + 120
        while not addr.exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        assert not events.exists()  # no server before the learner's weights

        def version(v, broken=False):
            def export(path):
                os.makedirs(path)
                (pathlib.Path(path) / "config.json").write_text("{}")
            uri = publish(str(workdir / "publish"), v, {"w": np.full(2, v, np.float32)},
                          hf_export=export)
            if broken:  # the server cannot load this one
                os.remove(pathlib.Path(uri).parent / "hf" / "config.json")
            return uri

        cfg = sao_math.get_config("cpu")
        records = [r for t in components.make_tasks(cfg).values() for r in t.records()][:40]
        d_cfg = DispatcherConfig(batch_size=2, vocab_size=272, tau=0, reconnect_s=0.1,
                                 security=Security(token=token))
        d = Dispatcher([addr.read_text()], records, d_cfg)
        d.push_weights(0, version(0))  # before any lease: the worker starts its server on it
        with d:
            first = d.get_batch(timeout=60)
            d.push_weights(1, version(1))
            second = d.get_batch(timeout=60)
            d.push_weights(2, version(2, broken=True))
            t0 = time.monotonic()
            with pytest.raises(FleetError) as err:
                d.get_batch(timeout=60)
            gave_up_s = time.monotonic() - t0
        started = [json.loads(line) for line in events.read_text().splitlines()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert [pathlib.Path(e["model_path"]).parts[-2:] for e in started] == \
        [("v0000000000", "hf"), ("v0000000001", "hf")]
    assert all(set(t.policy_version) == {0} for t in first)
    assert all(set(t.policy_version) == {1} for t in second)
    assert "worker reports itself unusable" in str(err.value) and "2 weight loads failed" in str(err.value)
    assert addr.read_text() in str(err.value) and gave_up_s < 60
    assert not any(_alive(e["pid"]) for e in started)  # the worker stopped its server
    assert (workdir / "workers" / "sglang0.log").exists()
