"""SGLangEngine weight loads: the two reload modes, supervision of a dead
server and the bounded failure policy, against a fake SGLang HTTP server.
(The real servers: test_sglang_restart_reload.py, test_sglang_real_server.py.)"""
import asyncio

import pytest
from aiohttp import web

from sao.rollout import EngineError, SamplingParams
from sao.rollout.sglang_engine import SGLangEngine
from test_sglang_client import FakeSGLang, run_with


class FailingUpdates(FakeSGLang):
    """Refuses ``/update_weights_from_disk`` for the paths in ``refuse``, or
    answers it after ``update_delay_s``."""

    def __init__(self, refuse=(), update_delay_s=0.0, **kw):
        super().__init__(**kw)
        self.refuse, self.update_delay_s = set(refuse), update_delay_s

    async def update(self, request):
        body = await request.json()
        self.updates.append(body)
        await asyncio.sleep(self.update_delay_s)
        if body["model_path"] in self.refuse:
            return web.json_response({"success": False, "message": "cannot read"})
        return web.json_response({"success": True, "message": "ok"})


class UpdatedNotFlushed(FakeSGLang):
    """Answers ``/update_weights_from_disk`` as SGLang does when a request was still
    in its scheduler: HTTP 400, weights updated, cache not flushed. ``/flush_cache``
    then succeeds unless ``flush_ok`` is False."""

    def __init__(self, flush_ok=True, **kw):
        super().__init__(**kw)
        self.flush_ok, self.flush_waits = flush_ok, []

    async def update(self, request):
        self.updates.append(await request.json())
        return web.json_response(status=400, data={"success": False, "message": (
            "Weights were updated, but the cache was not flushed because requests are "
            "still running or queued. Retract or finish them, then call /flush_cache.")})

    async def flush(self, request):
        self.flush_waits.append(float(request.query.get("timeout", 0)))
        if self.flush_ok:
            return web.Response(text="Cache flushed.")
        return web.Response(status=400, text="Timed out waiting for idle state.")


def test_an_update_whose_flush_was_refused_flushes_once_the_server_is_idle():
    fake = UpdatedNotFlushed()

    async def body(e):
        await e.load_weights(2, "/ckpt/2/hf")
        return e.version, e.reload_failures
    assert run_with(fake, body, reload_timeout_s=7.0) == (2, 0)
    assert fake.flush_waits == [7.0]  # the server is asked to wait for idle, not refused at once


def test_an_update_whose_cache_never_flushes_is_a_failed_load():
    fake = UpdatedNotFlushed(flush_ok=False)

    async def body(e):
        with pytest.raises(EngineError, match="flush_cache.*HTTP 400"):
            await e.load_weights(2, "/ckpt/2/hf")
        return e.version, e.reload_failures
    assert run_with(fake, body) == (0, 1)


class Server:
    """What the engine uses of an SGLangServer: running() and restart(path)."""

    def __init__(self, *, alive=True, fail=()):
        self.alive, self.fail, self.restarts = alive, set(fail), []

    def running(self):
        return self.alive

    def restart(self, path):
        self.restarts.append(path)
        self.alive = path not in self.fail
        if not self.alive:
            raise RuntimeError(f"SGLang server exited with 1: cannot load {path}")


def test_failed_loads_in_a_row_make_the_engine_unusable():
    fake = FailingUpdates(refuse={"/bad"})

    async def body(e):
        await e.load_weights(1, "/good/1")
        with pytest.raises(EngineError, match="refused"):
            await e.load_weights(2, "/bad")
        await e.load_weights(2, "/good/2")  # a success resets the count
        assert e.reload_failures == 0 and e.unusable is None and await e.health()
        for _ in range(2):
            with pytest.raises(EngineError, match="refused"):
                await e.load_weights(3, "/bad")
        assert e.unusable and "2 weight loads failed in a row" in e.unusable
        assert "/bad" in e.unusable and "cannot read" in e.unusable
        n = len(fake.updates)
        with pytest.raises(EngineError, match="unusable"):
            await e.load_weights(3, "/good/3")
        with pytest.raises(EngineError, match="unusable"):
            await e.generate([1], SamplingParams())
        assert len(fake.updates) == n and not await e.health()  # the server was not asked
        return e.version
    assert run_with(fake, body, max_reload_failures=2) == 2


def test_a_hanging_update_fails_within_its_timeout():
    fake = FailingUpdates(update_delay_s=5.0)

    async def body(e):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(EngineError, match="2 attempts"):
            await e.load_weights(1, "/slow")
        return loop.time() - t0
    # reload_timeout_s bounds each attempt; the engine's 600 s request timeout does not apply.
    assert run_with(fake, body, reload_timeout_s=0.2, max_retries=1) < 3.0


def test_restart_mode_failure_is_counted_and_waiting_requests_fail_fast():
    server = Server(fail={"/broken"})
    fake = FakeSGLang()

    async def body(e):
        await e.load_weights(1, "/v1/params")  # a publish uri: its HF export is served
        with pytest.raises(EngineError, match="restarting the server on /broken failed"):
            await e.load_weights(2, "/broken")
        assert e.version == 1 and not await e.health()  # the server is down
        with pytest.raises(EngineError, match="exited"):
            await e.load_weights(2, "/broken")
        with pytest.raises(EngineError, match="unusable"):
            await e.generate([1], SamplingParams())
        return e.version
    assert run_with(fake, body, server=server, reload="restart", max_reload_failures=2) == 1
    assert server.restarts == ["/v1/hf", "/broken", "/broken"] and fake.updates == []


def test_a_dead_supervised_server_is_restarted_by_the_next_load():
    server = Server(alive=False)
    fake = FakeSGLang()

    async def body(e):
        assert not await e.health()  # its process is gone: no HTTP probe needed
        await e.load_weights(1, "/hf/1")  # restart, not /update_weights_from_disk
        assert await e.health()
        await e.load_weights(2, "/hf/2")  # alive again: the endpoint
        return (await e.generate([1], SamplingParams())).versions
    assert run_with(fake, body, server=server) == [2, 2, 2]
    assert server.restarts == ["/hf/1"]
    assert [u["model_path"] for u in fake.updates] == ["/hf/2"]


def test_a_push_repeated_while_its_restart_runs_restarts_once():
    # A dispatcher that gave up on a slow restart (loaded machine) re-syncs the worker
    # with the same version: the second call waits for the first and then has nothing
    # to do (CI once saw a sglang-jax server start twice on v1).
    class SlowServer(Server):
        def restart(self, path):
            import time
            time.sleep(0.3)
            super().restart(path)
    server = SlowServer()

    async def body(e):
        await asyncio.gather(e.load_weights(1, "/v1/params"), e.load_weights(1, "/v1/params"))
        await e.load_weights(1, "/v1b/params")   # the same version from elsewhere: loaded
        return e.version
    assert run_with(FakeSGLang(), body, server=server, reload="restart") == 1
    assert server.restarts == ["/v1/hf", "/v1b/hf"]


def test_reload_arguments_are_checked():
    with pytest.raises(ValueError, match="reload must be one of"):
        SGLangEngine("http://x", reload="hot_swap")
    with pytest.raises(ValueError, match="needs the SGLangServer"):
        SGLangEngine("http://x", reload="restart")
    with pytest.raises(ValueError, match="max_reload_failures"):
        SGLangEngine("http://x", max_reload_failures=0)
