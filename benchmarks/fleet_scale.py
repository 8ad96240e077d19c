"""Dispatcher at fleet scale: N simulated rollout workers against one dispatcher.

    .venv/bin/python benchmarks/fleet_scale.py          # default sweep, about 80 s

Workers are real token-checked gRPC servers in ``--hosts`` subprocesses
(``fleet_hosts.py``: an episode sleeps ``length x --seconds_per_token``, then
returns a valid trajectory; log-normal lengths, median 1800, clipped to
1024-4096), so this process holds only the dispatcher, its links and the
simulated learner, and its CPU time is the dispatcher's. The learner pulls
batches of B=128, "trains" for ``train_s`` (sleep) and pushes new weights to
every worker after each step, like the run's loop.

Runs, each measured over ``--window_s`` after ``--warmup_s``:

* ``push_idle`` (reference): ``push_weights`` to N connected, idle workers;
* ``raw`` (reference): a bare client per worker keeps ``(tau+1)·B`` leases in
  flight on the same streams and counts answers without decoding them
  (transport + workers, no dispatcher), at the largest N;
* ``train_s=0`` at each N: the learner takes batches as fast as they come, so
  ingest is the fleet's own limit (on a small machine: the CPU the workers
  leave the dispatcher); again with ``--long_scale`` x longer trajectories;
* each ``--train_s`` at the largest N: operating points below the limit.

Per run: arrivals/s (answers ingested, drops included), trained
trajectories/s and tokens/s, MB/s, trajectories per response message, the
dispatcher process's CPU (cores, and ms per arrival, split into link threads,
the learner thread and the rest: gRPC core and push threads), the workers'
CPU, learner idle fraction (time in ``get_batch`` / window), push latency.
Also the in-process CPU cost of ``codec.decode`` and ``validate`` of one
median trajectory. Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import secrets
import threading
import time

import grpc
import numpy as np

from fleet_hosts import VOCAB, Hosts, VersionEngine, episode_fn
from sao.fleet import sim
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.rpc import auth, codec, sao_pb2, sao_pb2_grpc
from sao.types import validate


def prompt_stream(args, scale: int, tag: str):
    """Endless prompts with ``sim.lognormal_prompts`` lengths x ``scale`` and
    ``--prompt_bytes`` of text, like a task statement."""
    pool = sim.lognormal_prompts(4096, median=args.median_len, sigma=args.sigma, seed=args.seed,
                                 min_len=args.min_len, max_len=args.max_len)
    text, i = "x" * args.prompt_bytes, 0
    while True:
        p = pool[i % len(pool)]
        yield {"prompt_id": f"{tag}{i}", "length": p["length"] * scale, "reward": p["reward"],
               "truncated": p["length"] >= args.max_len, "text": text}
        i += 1


def cpu_now(prefix: str) -> dict[str, float]:
    """This process's CPU seconds: all, threads named ``prefix*``, this thread."""
    links = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.ident is not None:
            try:
                links += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, ProcessLookupError):  # ended meanwhile
                pass
    return {"process": time.process_time(), "links": links, "main": time.thread_time()}


def mark(t0: float, prefix: str, hosts: Hosts, counts: dict) -> dict:
    return {"t": time.perf_counter() - t0, "cpu": cpu_now(prefix), "hosts": hosts.cpu_s(), **counts}


def delta(a: dict, b: dict) -> dict:
    return {k: v - a.get(k, 0) for k, v in b.items() if v > a.get(k, 0)}


def summary(a: dict, b: dict) -> dict:
    """Rates and CPU between two ``mark``s."""
    wall, arrived = b["t"] - a["t"], b["arrived"] - a["arrived"]
    cpu = {k: b["cpu"][k] - a["cpu"][k] for k in a["cpu"]}
    per = 1e3 / max(arrived, 1)
    return {"window_s": round(wall, 2), "arrivals_per_s": round(arrived / wall, 1),
            "mb_per_s": round((b["bytes"] - a["bytes"]) / wall / 1e6, 2),
            "traj_per_message": round(arrived / max(b["messages"] - a["messages"], 1), 2),
            "dispatcher_cores": round(cpu["process"] / wall, 3),
            "dispatcher_cpu_ms_per_traj": round(cpu["process"] * per, 3),
            "link_threads_cpu_ms_per_traj": round(cpu["links"] * per, 3),
            "learner_thread_cpu_ms_per_traj": round(cpu["main"] * per, 3),
            "other_cpu_ms_per_traj": round((cpu["process"] - cpu["links"] - cpu["main"]) * per, 3),
            "worker_cores": round((b["hosts"] - a["hosts"]) / wall, 3)}


def run_dispatcher(args, hosts, security, n: int, train_s: float, scale: int,
                   version: int) -> tuple[dict, int]:
    cfg = DispatcherConfig(batch_size=args.batch_size, vocab_size=VOCAB, tau=args.tau,
                           security=security, initial_version=version,
                           max_length=args.max_len * scale)
    d = Dispatcher(hosts.addresses[:n], prompt_stream(args, scale, f"v{version}-"), cfg)
    messages, ingest = [0], d.link_response

    def counted(link, response):  # counts response messages from the workers
        messages[0] += 1
        ingest(link, response)

    def counts() -> dict:
        s = d.snapshot()
        return {"arrived": s["accepted"] + s["dropped"], "drops": s["drops"],
                "bytes": sum(w["bytes"] for w in s["workers"].values()),
                "staleness": s["staleness"], "messages": messages[0]}

    d.link_response = counted
    version += 1
    d.push_weights(version, f"/publish/{version}")  # links sync to it before any lease
    t0, idle, steps, tokens, pushes = time.perf_counter(), 0.0, 0, 0, []
    start = end = None
    with d:
        while end is None:
            if start is None and time.perf_counter() - t0 >= args.warmup_s:
                start = mark(t0, "link-", hosts, counts())
            elif start is not None and time.perf_counter() - t0 - start["t"] >= args.window_s:
                end = mark(t0, "link-", hosts, counts())
                break
            tw = time.perf_counter()
            batch = d.get_batch(timeout=120)
            waited = time.perf_counter() - tw
            time.sleep(train_s)
            tp = time.perf_counter()
            version += 1
            d.push_weights(version, f"/publish/{version}")
            if start is not None:
                idle, steps = idle + waited, steps + 1
                tokens += sum(t.length for t in batch)
                pushes.append(time.perf_counter() - tp)
    wall, lags = end["t"] - start["t"], delta(start["staleness"], end["staleness"])
    return {"kind": "dispatcher", "workers": n, "train_s": train_s, "length_scale": scale,
            **summary(start, end), "steps": steps,
            "trained_per_s": round(steps * args.batch_size / wall, 1),
            "trained_tokens_per_s": round(tokens / wall),
            "learner_idle_fraction": round(idle / wall, 4),
            "push_fraction": round(sum(pushes) / wall, 4),
            "push_ms_median": round(1e3 * float(np.median(pushes)), 2) if pushes else None,
            "push_ms_max": round(1e3 * max(pushes), 2) if pushes else None,
            "mean_lag": round(sum(k * v for k, v in lags.items()) / max(sum(lags.values()), 1), 2),
            "drops": delta(start["drops"], end["drops"])}, version


def run_raw(args, hosts, security, n: int) -> dict:
    """Reference: bare streams, ``(tau+1)·B`` leases in flight, answers counted, not decoded."""
    inflight = max(1, (args.tau + 1) * args.batch_size // n)
    counts, stop, calls = [[0, 0, 0, 0] for _ in range(n)], threading.Event(), []
    names = ("arrived", "bytes", "tokens", "messages")

    def drain(i: int, address: str):
        prompts, lengths, q = prompt_stream(args, 1, f"raw{i}-"), {}, queue.Queue()

        def leases(k: int) -> sao_pb2.GenerateRequest:
            out = []
            for p in (next(prompts) for _ in range(k)):
                lengths[p["prompt_id"]] = p["length"]
                out.append(sao_pb2.Lease(lease_id=p["prompt_id"], prompt_id=p["prompt_id"],
                                         prompt_json=json.dumps(p)))
            return sao_pb2.GenerateRequest(leases=out)

        def requests():
            while (item := q.get()) is not None:
                yield item

        with auth.open_channel(address, security) as channel:
            q.put(leases(inflight))
            call = sao_pb2_grpc.RolloutWorkerStub(channel).Generate(
                requests(), metadata=auth.call_metadata(security))
            calls.append(call)
            try:
                for response in call:
                    c = counts[i]
                    c[3] += 1
                    for f in response.finished:
                        c[0] += 1
                        c[1] += len(f.trajectory)
                        c[2] += lengths.pop(f.lease_id)
                    if stop.is_set():
                        break
                    q.put(leases(len(response.finished)))
            except grpc.RpcError:
                if not stop.is_set():
                    raise
            finally:
                q.put(None)

    threads = [threading.Thread(target=drain, args=(i, a), name=f"raw-{i}", daemon=True)
               for i, a in enumerate(hosts.addresses[:n])]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(args.warmup_s)
    start = mark(t0, "raw-", hosts, {k: sum(c[i] for c in counts) for i, k in enumerate(names)})
    time.sleep(args.window_s)
    end = mark(t0, "raw-", hosts, {k: sum(c[i] for c in counts) for i, k in enumerate(names)})
    stop.set()
    for call in list(calls):
        call.cancel()
    for t in threads:
        t.join(10)
    return {"kind": "raw", "workers": n, **summary(start, end),
            "tokens_per_s": round((end["tokens"] - start["tokens"]) / (end["t"] - start["t"]))}


def push_idle(args, hosts, security, n: int, version: int, pushes: int = 10) -> tuple[dict, int]:
    """Reference: ``push_weights`` to ``n`` connected workers with nothing in flight."""
    cfg = DispatcherConfig(batch_size=args.batch_size, vocab_size=VOCAB, tau=args.tau,
                           security=security, initial_version=version)
    d = Dispatcher(hosts.addresses[:n], iter(()), cfg)
    version += 1
    d.push_weights(version, f"/publish/{version}")
    times, cpu = [], 0.0
    with d:
        deadline = time.monotonic() + 60
        while sum(w["live"] for w in d.snapshot()["workers"].values()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} workers did not all connect within 60 s")
            time.sleep(0.05)
        for _ in range(pushes):
            version += 1
            t, c = time.perf_counter(), time.process_time()
            acks = d.push_weights(version, f"/publish/{version}")
            times.append(time.perf_counter() - t)
            cpu += time.process_time() - c
            if sorted(acks.values()) != [version] * n:
                raise RuntimeError(f"push not acknowledged by every worker: {acks}")
    return {"workers": n, "push_ms_median": round(1e3 * float(np.median(times)), 2),
            "push_ms_max": round(1e3 * max(times), 2),
            "push_cpu_ms": round(1e3 * cpu / pushes, 2)}, version


def decode_validate_us(args, repeats: int = 300) -> dict:
    """CPU microseconds of ``codec.try_decode`` and of ``validate`` for one median trajectory."""
    n = int(args.median_len)
    traj = asyncio.run(episode_fn(VersionEngine(), 0.0, args.seed)({"length": n, "reward": 1.0}))
    data = codec.encode(traj)
    t0 = time.process_time()
    for _ in range(repeats):
        got, _ = codec.try_decode(data)
    t1 = time.process_time()
    for _ in range(repeats):
        validate(got, vocab_size=VOCAB, learner_version=1, max_length=args.max_len,
                 max_abs_reward=1e6)
    t2 = time.process_time()
    return {"tokens": n, "wire_bytes": len(data), "decode_us": round(1e6 * (t1 - t0) / repeats, 1),
            "validate_us": round(1e6 * (t2 - t1) / repeats, 1)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", default="8,16,64", help="worker counts of the train_s=0 runs")
    p.add_argument("--train_s", default="0.1,0.5", help="learner step times at the largest N")
    p.add_argument("--long_scale", type=int, default=4, help="length factor of one run (0: none)")
    p.add_argument("--hosts", type=int, default=4, help="worker host processes")
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--tau", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=128, help="episodes per worker")
    p.add_argument("--seconds_per_token", type=float, default=1e-5)
    p.add_argument("--median_len", type=float, default=1800)
    p.add_argument("--sigma", type=float, default=0.4)
    p.add_argument("--min_len", type=int, default=1024)
    p.add_argument("--max_len", type=int, default=4096)
    p.add_argument("--prompt_bytes", type=int, default=512)
    p.add_argument("--warmup_s", type=float, default=2.0)
    p.add_argument("--window_s", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ns = sorted(int(x) for x in args.n.split(","))
    big, steps = ns[-1], [float(x) for x in args.train_s.split(",") if x.strip()]
    token = secrets.token_urlsafe(32)
    security = auth.Security(token=token)
    load_start = os.getloadavg()[0]
    micro = decode_validate_us(args)
    runs, pushes, version = [], [], 0
    with Hosts(big, min(args.hosts, big), token, concurrency=args.concurrency,
               seconds_per_token=args.seconds_per_token, seed=args.seed) as hosts:
        for n in ns:
            r, version = push_idle(args, hosts, security, n, version)
            pushes.append(r)
        runs.append(run_raw(args, hosts, security, big))
        plan = [(n, 0.0, 1) for n in ns] + [(big, 0.0, args.long_scale)] * (args.long_scale > 0)
        for n, train_s, scale in plan + [(big, t, 1) for t in steps]:
            r, version = run_dispatcher(args, hosts, security, n, train_s, scale, version)
            runs.append(r)
            print(json.dumps(r), flush=True)
        n_hosts = len(hosts.procs)
    raw, sat = runs[0], {r["workers"]: r for r in runs[1:len(ns) + 1]}
    ratio = sat[big]["arrivals_per_s"] / sat[ns[0]]["arrivals_per_s"]
    report = {
        "benchmark": "fleet_scale", "workers": big, "hosts": n_hosts,
        "batch_size": args.batch_size, "tau": args.tau, "cpus": os.cpu_count(),
        "python": platform.python_version(), "grpc": grpc.__version__,
        "load_avg_start": round(load_start, 2),
        "load_avg_end": round(os.getloadavg()[0], 2), "decode_validate": micro,
        "push_idle": pushes, "runs": runs,
        "dispatcher_over_raw": round(sat[big]["arrivals_per_s"] / raw["arrivals_per_s"], 3),
        f"n{big}_over_n{ns[0]}": round(ratio, 3),
        "traj_per_s_per_dispatcher_core": round(1e3 / sat[big]["dispatcher_cpu_ms_per_traj"], 1),
        "decode_validate_share": round((micro["decode_us"] + micro["validate_us"]) / 1e3
                                       / sat[big]["dispatcher_cpu_ms_per_traj"], 3)}
    print(f"raw reference N={big}: {raw['arrivals_per_s']:.0f} traj/s, "
          f"{raw['dispatcher_cpu_ms_per_traj']:.2f} ms CPU/traj; idle push: "
          + ", ".join(f"N={q['workers']} {q['push_ms_median']} ms" for q in pushes))
    for r in runs[1:]:
        print(f"N={r['workers']:3d} train_s={r['train_s']:<4} x{r['length_scale']}: "
              f"{r['arrivals_per_s']:6.0f} traj/s in, "
              f"{r['trained_tokens_per_s'] / 1e6:5.2f}M tok/s, "
              f"dispatcher {r['dispatcher_cores']:.2f} cores ({r['dispatcher_cpu_ms_per_traj']:.2f}"
              f" ms/traj), workers {r['worker_cores']:.2f} cores, learner idle "
              f"{100 * r['learner_idle_fraction']:.1f}%, push {r['push_ms_median']} ms")
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
