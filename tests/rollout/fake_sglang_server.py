"""A stand-in SGLang server process for tests of the worker's server lifecycle.

    python -m fake_sglang_server --model-path DIR --host H --port P --skip-tokenizer-init [--no-update]

Speaks the part of SGLang's HTTP API the client uses (``/health``,
``/generate``, ``/update_weights_from_disk``, ``/flush_cache``) and prints
SGLang's readiness line. Like a real server it refuses to start on a
directory without ``config.json`` (exit status 1), and ``--no-update`` makes
``/update_weights_from_disk`` answer 404 as sglang-jax does. Each start and
weight update appends one JSON line (``{"event", "model_path"}``) to
``$FAKE_SGLANG_EVENTS``, so a test can tell which weights were served when.
Generation: ``max_new_tokens`` tokens counting up from 10, log-prob -1 each.
Unknown flags are ignored.
"""
import argparse
import json
import os
import sys

from aiohttp import web

READY = "The server is fired up and ready to roll!"


def record(event: str, model_path: str) -> None:
    path = os.environ.get("FAKE_SGLANG_EVENTS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": event, "model_path": model_path, "pid": os.getpid()}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--no-update", action="store_true")
    args, _ = parser.parse_known_args()
    if not os.path.isfile(os.path.join(args.model_path, "config.json")):
        print(f"cannot load {args.model_path}: no config.json", flush=True)
        sys.exit(1)
    record("start", args.model_path)

    async def health(request):
        return web.Response(text="ok")

    async def generate(request):
        body = await request.json()
        n = int(body["sampling_params"]["max_new_tokens"])
        ids = [10 + i for i in range(n)]
        return web.json_response({"output_ids": ids, "meta_info": {
            "finish_reason": {"type": "length", "length": n},
            "output_token_logprobs": [[-1.0, t, None] for t in ids]}})

    async def update(request):
        body = await request.json()
        if not os.path.isfile(os.path.join(body["model_path"], "config.json")):
            return web.json_response({"success": False, "message": "no config.json"})
        record("update", body["model_path"])
        return web.json_response({"success": True, "message": "ok"})

    async def flush(request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    if not args.no_update:
        app.router.add_post("/update_weights_from_disk", update)
    app.router.add_post("/flush_cache", flush)
    web.run_app(app, host=args.host, port=args.port, print=lambda *a: print(READY, flush=True))


if __name__ == "__main__":
    main()
