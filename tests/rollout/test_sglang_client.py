"""SGLangEngine against a fake SGLang HTTP server (retries, timeouts, parsing, reloads).

The real servers are exercised in test_sglang_restart_reload.py (sglang-jax) and
test_sglang_real_server.py (SGLang); these tests pin the
client's behaviour on the failure paths a real server rarely shows on demand.
"""
import asyncio
import threading

import pytest
from aiohttp import web

from sao.rollout import EngineError, SamplingParams
from sao.rollout.sglang_engine import SGLangEngine


class FakeSGLang:
    def __init__(self, *, fail_first=0, delay_s=0.0, n_tokens=3, repeat=0, abort_first=0):
        self.fail_first, self.delay_s, self.n_tokens = fail_first, delay_s, n_tokens
        self.repeat, self.abort_first = repeat, abort_first
        self.requests, self.updates, self.flushes = [], [], 0

    async def generate(self, request):
        body = await request.json()
        self.requests.append(body)
        if len(self.requests) <= self.fail_first:
            return web.Response(status=503, text="busy")
        await asyncio.sleep(self.delay_s)
        ids = [10 + i for i in range(self.n_tokens)]
        entries = [[-0.5 - i, t, None] for i, t in enumerate(ids)]
        finish = {"type": "length", "length": self.n_tokens}
        if len(self.requests) <= self.fail_first + self.abort_first:
            finish = {"type": "abort", "message": "shutting down"}
        return web.json_response({"output_ids": ids, "meta_info": {
            "finish_reason": finish,
            "output_token_logprobs": entries[:self.repeat] + entries}})

    async def health(self, request):
        return web.Response(text="ok")

    async def update(self, request):
        self.updates.append(await request.json())
        return web.json_response({"success": True, "message": "ok"})

    async def flush(self, request):
        self.flushes += 1
        return web.Response(text="ok")


async def serve(fake):
    app = web.Application()
    app.router.add_post("/generate", fake.generate)
    app.router.add_get("/health", fake.health)
    app.router.add_post("/update_weights_from_disk", fake.update)
    app.router.add_post("/flush_cache", fake.flush)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def run_with(fake, body, **engine_kwargs):
    async def main():
        runner, url = await serve(fake)
        engine = SGLangEngine(url, backoff_s=0.01, **engine_kwargs)
        try:
            return await body(engine)
        finally:
            await engine.close()
            await runner.cleanup()
    return asyncio.run(main())


def test_generate_sends_token_ids_and_parses_repeated_logprobs():
    fake = FakeSGLang(repeat=2)
    c = run_with(fake, lambda e: e.generate([1, 2], SamplingParams(
        temperature=0.7, max_new_tokens=3, stop_token_ids=(5,))), version=3)
    assert c.tokens == [10, 11, 12] and c.logprobs == [-0.5, -1.5, -2.5]
    assert c.versions == [3, 3, 3] and c.finish_reason == "length"
    sent = fake.requests[0]
    assert sent["input_ids"] == [1, 2] and sent["return_logprob"] is True
    assert sent["sampling_params"] == {"temperature": 0.7, "top_p": 1.0, "top_k": -1,
                                       "max_new_tokens": 3, "stop_token_ids": [5]}


def test_retries_on_503_and_abort_then_succeeds():
    fake = FakeSGLang(fail_first=2, abort_first=1)
    async def body(e):
        return await e.generate([1], SamplingParams()), e.num_retries
    c, retries = run_with(fake, body, max_retries=2)
    assert c.tokens == [10, 11, 12] and retries == 3 and len(fake.requests) == 4


def test_gives_up_with_engine_error():
    with pytest.raises(EngineError, match="3 attempts"):
        run_with(FakeSGLang(fail_first=10), lambda e: e.generate([1], SamplingParams()),
                 max_retries=2)
    with pytest.raises(EngineError, match="attempts"):
        run_with(FakeSGLang(delay_s=0.6), lambda e: e.generate([1], SamplingParams()),
                 max_retries=1, timeout_s=0.2)


def test_health_and_unreachable_server():
    assert run_with(FakeSGLang(), lambda e: e.health())
    async def dead():
        e = SGLangEngine("http://127.0.0.1:9", max_retries=0)
        try:
            return await e.health()
        finally:
            await e.close()
    assert asyncio.run(dead()) is False


def test_load_weights_from_disk_then_flush():
    fake = FakeSGLang()
    async def body(e):
        await e.load_weights(4, "/ckpt/v0000000004/params")  # a sao.ckpt.publish uri
        with pytest.raises(ValueError, match="older"):
            await e.load_weights(2, "/ckpt/2/hf")
        return (await e.generate([1], SamplingParams())).versions
    assert run_with(fake, body) == [4, 4, 4]
    assert fake.updates == [{"model_path": "/ckpt/v0000000004/hf", "weight_version": "4"}]
    assert fake.flushes == 1


async def request_reload_request(e):
    """Tasks: a request, a load of version 1 sent while it is in flight, and a second
    request sent while the load waits (it must wait for the load)."""
    first = asyncio.create_task(e.generate([1], SamplingParams()))
    await asyncio.sleep(0.1)
    reload = asyncio.create_task(e.load_weights(1, "/hf/1"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(e.generate([2], SamplingParams()))
    return first, reload, second


def test_restart_on_reload_drains_in_flight_requests_first():
    events = []

    class Server:
        def running(self):
            return True

        def restart(self, path):
            events.append(("restart", path))

    fake = FakeSGLang(delay_s=0.3)
    async def body(e):
        first, reload, second = await request_reload_request(e)
        c1 = await first
        events.append(("first_done", c1.versions))
        await reload
        c2 = await second
        return c1, c2
    c1, c2 = run_with(fake, body, server=Server(), reload="restart")
    assert events == [("first_done", [0, 0, 0]), ("restart", "/hf/1")]
    assert c2.versions == [1, 1, 1] and fake.updates == []
    with pytest.raises(ValueError, match="needs the SGLangServer"):
        SGLangEngine("http://x", reload="restart")


def test_update_on_reload_drains_in_flight_requests_first():
    events = []

    class Recording(FakeSGLang):
        async def generate(self, request):
            out = await super().generate(request)
            events.append(("generated", len(self.updates)))
            return out

        async def update(self, request):
            events.append(("update", len(self.requests)))
            return await super().update(request)

    fake = Recording(delay_s=0.3)
    async def body(e):
        first, reload, second = await request_reload_request(e)
        c1, _, c2 = await asyncio.gather(first, reload, second)
        return c1.versions, c2.versions
    assert run_with(fake, body) == ([0, 0, 0], [1, 1, 1])
    # the update came after the first request finished, the second after the flush
    assert events == [("generated", 0), ("update", 1), ("generated", 1)] and fake.flushes == 1


def test_cancelled_requests_leave_the_engine_drainable():
    """A request cancelled in flight (an abandoned episode) is counted out at once: the
    next load does not wait for it, and a request after the load is served."""
    fake = FakeSGLang(delay_s=5.0)

    async def body(e):
        tasks = [asyncio.create_task(e.generate([i], SamplingParams())) for i in range(3)]
        await asyncio.sleep(0.1)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        fake.delay_s = 0.0
        await asyncio.wait_for(e.load_weights(1, "/hf/1"), timeout=3.0)
        return (await e.generate([9], SamplingParams())).versions
    assert run_with(fake, body) == [1, 1, 1]


def test_engine_survives_successive_event_loops():
    """Drivers call asyncio.run per evaluation: the engine must not keep a dead loop's session."""
    fake = FakeSGLang()
    ready, stop = threading.Event(), threading.Event()
    box = {}

    def server_thread():
        async def main():
            box["runner"], box["url"] = await serve(fake)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.01)
            await box["runner"].cleanup()
        asyncio.run(main())
    t = threading.Thread(target=server_thread)
    t.start()
    try:
        assert ready.wait(10)
        engine = SGLangEngine(box["url"], backoff_s=0.01)
        for _ in range(2):  # two loops, one engine
            c = asyncio.run(engine.generate([1], SamplingParams()))
            assert c.tokens == [10, 11, 12]
        asyncio.run(engine.close())
    finally:
        stop.set()
        t.join(10)


def test_concurrent_loads_apply_in_version_order():
    fake = FakeSGLang()

    async def body(e):
        await asyncio.gather(e.load_weights(2, "/hf/2"), e.load_weights(1, "/hf/1"))
        return e.version
    assert run_with(fake, body) == 2
    assert [u["weight_version"] for u in fake.updates] == ["2"]
