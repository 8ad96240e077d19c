"""Wiring of one run: tokenizer, tasks, environments, engines, fleet, learner, phases.

Roles (``sao.main --role``):

* ``rollout`` — :func:`rollout_worker`: one gRPC worker (engine + agent loop + envs);
* ``learner`` — :func:`learner`: SFT warm start → held-out eval → value
  pretraining → the asynchronous SAO loop (``sao.driver.train``) against
  ``rollout.worker_addresses`` → final eval → ``summary.json``;
* ``all`` — :func:`run_all`: spawns ``rollout.num_workers`` worker processes on
  127.0.0.1, then runs the learner against them.

Every phase is cached in the workdir, so a rerun resumes: ``sft/`` (SFT
weights), ``eval_before.json``, ``ckpt/`` (step 0 = after value pretraining,
then every ``checkpoint.every`` steps: actor, critic, version, prompt
iterator and fleet state), ``publish/`` (weights for the fleet).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sao.build import (  # noqa: F401  (re-exported: sao.run.<name> is public)
    DRIVER_KEYS,
    learner_config,
    running_mean_baseline,
    make_tokenizer,
    make_policy,
    make_tasks,
    make_env_factory,
    engine_clock,
    env_metrics,
    sampling_params,
    turn_format,
    episode_kwargs,
    NO_WEIGHTS_VERSION,
    make_engine)


def rollout_worker(cfg, workdir: str, *, host: str = "127.0.0.1", port: int = 0,
                   worker_index: int = 0, sglang_url: str = "", address_file: str = "") -> None:
    """Serves one rollout worker until SIGINT / SIGTERM (``--role=rollout``)."""
    from sao.fleet.worker import WorkerConfig, agent_episode_fn, run
    from sao.rpc.auth import Security
    tokenizer = make_tokenizer(cfg)

    def make():
        engine = make_engine(cfg, seed=cfg.seed * 1000 + worker_index + 1, sglang_url=sglang_url)
        make_env = make_env_factory(cfg, make_tasks(cfg), clock=engine_clock(lambda: engine))
        episode = agent_episode_fn(engine, make_env, tokenizer,
                                   sampling_params(cfg, tokenizer), **episode_kwargs(cfg, tokenizer))
        return engine, episode

    def ready(address: str) -> None:
        if address_file:
            tmp = address_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(address)
            os.replace(tmp, address_file)

    security = Security(token=_read_token(cfg.rollout.token_file))
    run(make, WorkerConfig(host=host, port=port, max_concurrency=cfg.rollout.max_concurrency,
                           worker_id=f"worker{worker_index}", security=security), ready=ready)


def _read_token(path: str) -> str:
    if not path:
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def spawn_workers(cfg, workdir: str, config_argv: list[str], *, timeout_s: float = 300.0):
    """Starts ``rollout.num_workers`` worker processes; returns ``(processes, addresses)``.

    Raises RuntimeError if a worker exits or is not serving within ``timeout_s``.
    """
    wdir = os.path.join(workdir, "workers")
    os.makedirs(wdir, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "XLA_FLAGS": " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                 if "device_count" not in f)}
    procs, files = [], []
    for i in range(cfg.rollout.num_workers):
        addr = os.path.join(wdir, f"worker{i}.addr")
        if os.path.exists(addr):
            os.remove(addr)
        argv = [sys.executable, "-m", "sao.main", *config_argv, f"--workdir={workdir}",
                "--role=rollout", "--port=0", f"--worker_index={i}", f"--address_file={addr}"]
        log = open(os.path.join(wdir, f"worker{i}.log"), "w")
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        files.append(addr)
    deadline = time.monotonic() + timeout_s
    while not all(os.path.exists(f) for f in files):
        dead = [i for i, p in enumerate(procs) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            stop_workers(procs)
            raise RuntimeError(f"rollout workers {dead or 'all'} did not start; see {wdir}/*.log")
        time.sleep(0.2)
    return procs, [open(f).read().strip() for f in files]


def stop_workers(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def run_all(cfg, workdir: str, *, config_argv: list[str]) -> dict:
    """``--role=all``: local rollout worker processes + the learner; returns the summary."""
    os.makedirs(workdir, exist_ok=True)
    if cfg.rollout.worker_addresses:
        return learner(cfg, workdir)
    procs, addresses = spawn_workers(cfg, workdir, config_argv)
    try:
        return learner(cfg, workdir, addresses=addresses)
    finally:
        stop_workers(procs)


def learner(cfg, workdir: str, *, addresses: list[str] | None = None) -> dict:
    """``--role=learner``: all learner phases (module doc); returns the summary dict.

    Raises ValueError without rollout workers, TimeoutError if the fleet stalls.
    """
    addresses = addresses or [a for a in cfg.rollout.worker_addresses.split(",") if a]
    if not addresses:
        raise ValueError("no rollout workers: set rollout.worker_addresses or use --role=all")
    from sao.learner import maybe_initialize_distributed
    maybe_initialize_distributed()
    t0 = time.monotonic()
    os.makedirs(workdir, exist_ok=True)
    from rich.console import Console
    from sao import metrics
    console = Console()
    with metrics.MetricsWriter(workdir, tensorboard=cfg.run.tensorboard) as writer:
        ctx = _LearnerContext(cfg, workdir, writer, console)
        summary = ctx.run(addresses)
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    write_json(os.path.join(workdir, metrics.SUMMARY_FILE), summary)
    console.print(metrics.summary_table(summary))
    return summary


class _PromptStream:
    """Thread-safe prompt iterator for the dispatcher: unique ids per epoch, each prompt
    ``group_size`` times (``#g<j>`` ids, for GRPO groups), checkpointable state."""

    def __init__(self, iterator, group_size: int = 1):
        import threading
        self._it, self._lock, self._group_size = iterator, threading.Lock(), group_size
        self._copies: list[dict] = []

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        with self._lock:
            if not self._copies:
                rec = next(self._it)
                pid = f"{rec['prompt_id']}#e{rec.get('epoch', 0)}"
                if self._group_size == 1:
                    return {**rec, "prompt_id": pid}
                self._copies = [{**rec, "prompt_id": f"{pid}#g{j}"} for j in range(self._group_size)]
            return self._copies.pop(0)

    def get_state(self) -> dict:
        with self._lock:
            return self._it.get_state()


class _EnvMetricsSource:
    """A trajectory source that keeps ``env_metrics`` of its last batch (``last``)."""

    def __init__(self, source):
        self.source, self.last = source, {}

    def get_batch(self, timeout: float | None = None):
        trajs = self.source.get_batch(timeout=timeout)
        self.last = env_metrics(trajs or [])
        return trajs

    def push_weights(self, version: int, uri: str, timeout: float | None = None) -> dict:
        return self.source.push_weights(version, uri, timeout)

    def snapshot(self) -> dict:
        return self.source.snapshot()


class _LearnerContext:
    """The learner's phases over one workdir (see the module doc for the cache layout)."""

    def __init__(self, cfg, workdir, writer, console):
        self.cfg, self.workdir, self.writer, self.console = cfg, workdir, writer, console
        self.tokenizer = make_tokenizer(cfg)
        self.tasks = make_tasks(cfg)
        self.make_env = make_env_factory(cfg, self.tasks, clock=engine_clock(lambda: self.engine))
        self.sampling = sampling_params(cfg, self.tokenizer)
        from sao.data.prompts import split_records
        records = [r for t in self.tasks.values() for r in t.records()]
        self.train_records, heldout = split_records(
            records, heldout_fraction=cfg.data.heldout_fraction, seed=cfg.data.split_seed)
        if len(heldout) < cfg.eval.num_prompts:
            raise ValueError(f"only {len(heldout)} held-out prompts < eval.num_prompts "
                             f"{cfg.eval.num_prompts}: raise env.task_size or data.heldout_fraction")
        self.heldout = heldout[:cfg.eval.num_prompts]

    def log(self, text: str) -> None:
        self.console.print(f"[bold cyan]sao[/] {text}")

    # -- phases ------------------------------------------------------------------
    def run(self, addresses: list[str]) -> dict:
        from sao import ckpt, driver
        from sao.learner import mesh_from_config
        from sao.learner.learner import Learner
        cfg, lc = self.cfg, learner_config(self.cfg)
        policy = make_policy(cfg, cfg.seed)
        if cfg.sft.steps:
            self.sft(policy)
        self.learner = Learner(lc, mesh_from_config(cfg.model.mesh), policy)
        states = self.learner.init_states()
        self.engine = make_engine(cfg, seed=cfg.seed + 7, model=policy)   # in-process eval sampler
        before = self.cached_eval(states)
        checkpointer = ckpt.Checkpointer(os.path.join(self.workdir, "ckpt"), max_to_keep=cfg.checkpoint.keep)
        start_step, data_state = 0, None
        if checkpointer.latest_step() is None:
            states = self.value_pretrain(states)
            self.save(checkpointer, states, 0, data_state=None, extra={})
        else:
            states, start_step, data_state = self.restore(checkpointer, states)
            self.log(f"resumed at step {start_step} (policy version {states.policy_version})")
        baseline = running_mean_baseline(cfg)              # running-mean advantages, or None
        if baseline is not None and (data_state or {}).get("baseline"):
            baseline.load_state_dict(data_state["baseline"])
        import shutil
        publish_dir = os.path.join(self.workdir, "publish")
        shutil.rmtree(publish_dir, ignore_errors=True)     # a crashed run may have published ahead
        publish = lambda s, v: ckpt.publish(publish_dir, v, self.param_state(s), keep=3)
        dispatcher, stream = self.dispatcher(addresses, states.policy_version, data_state)
        dispatcher.push_weights(states.policy_version, publish(states, states.policy_version))
        from sao.metrics import Progress
        loop = driver.LoopConfig(steps=cfg.run.steps, push_every=cfg.rollout.push_every,
                                 eval_every=cfg.eval.every, checkpoint_every=cfg.checkpoint.every,
                                 batch_timeout_s=cfg.run.batch_timeout_s)
        save = lambda s, step: self.save(checkpointer, s, step, data_state={
            "prompts": stream.get_state(), "dispatcher": dispatcher.state_dict(),
            "baseline": baseline.state_dict() if baseline is not None else None}, extra={})
        with dispatcher, Progress(cfg.run.steps, description="SAO", enabled=cfg.run.progress,
                                  keys=("rollout/reward", "rollout/tool_use", "eval/accuracy",
                                        "critic/explained_variance")) as bar:
            bar.update(start_step)
            source = _EnvMetricsSource(self.source(dispatcher))
            states, steps_done, _ = driver.train(
                self.learner, states, source, loop=loop, start_step=start_step,
                publish=publish, evaluate=self.evaluate, checkpoint=save,
                write=lambda step, m: self.writer.write(step, {**m, **source.last}),
                on_step=bar.update, advantages=baseline)
            save(states, steps_done)
        checkpointer.close()
        fleet = dispatcher.snapshot()                      # cumulative over resumes (saved with the fleet state)
        after = self.evaluate(states, steps_done)
        self.writer.write(steps_done, after)
        summary = {"accuracy_before": before["eval/accuracy"], "accuracy_after": after["eval/accuracy"],
                   "tool_use_before": before["eval/tool_use"], "tool_use_after": after["eval/tool_use"],
                   "steps": steps_done, "trajectories": fleet["trained"],
                   "dropped": fleet["dropped"], "eval_prompts": len(self.heldout),
                   "policy_version": states.policy_version}
        if cfg.env.get("drift_schedule"):                  # online env: adaptation per switch
            from sao import metrics
            from sao.envs.drift import drift_summary
            rl = [r for r in metrics.read_metrics(self.workdir) if r["phase"] == "rl"]
            summary["drift"] = drift_summary(
                rl, tuple(cfg.env.drift_schedule),
                recovery_fraction=cfg.env.get("drift_recovery_fraction", 0.9),
                window=cfg.env.get("drift_recovery_window", 3))
            self.log(f"drift: adaptation lag per switch {summary['drift']['adaptation_lag']} "
                     f"(policy versions), reward per phase {summary['drift']['phase_reward']}")
        return summary

    def sft(self, policy) -> None:
        from sao import sft
        from sao.data import sft as sft_data
        s = self.cfg.sft

        def make_data():
            demos = sft_data.arithmetic_demonstrations(s.num_demos, seed=s.seed, tool_fraction=s.tool_fraction,
                                                       task=s.task, task_kwargs=self._task_kwargs(s.task))
            return sft_data.tokenize_demonstrations(demos, self.tokenizer, max_len=s.max_len)

        self.log(f"SFT warm start: {s.steps} steps on {s.num_demos} demonstrations "
                 f"({100 * s.tool_fraction:.0f}% call the tool)")
        res = sft.cached_sft(policy, self.workdir, make_data, steps=s.steps, batch_size=s.batch_size,
                             lr=s.lr, warmup_steps=s.warmup_steps, seed=s.seed,
                             log=lambda step, m: self.writer.write(step, m, phase="sft"))
        self.log(f"SFT {'loaded from cache' if res['sft/cached'] else 'done'}: loss {res['sft/loss']:.3f}")

    def _task_kwargs(self, dataset: str) -> dict:
        conf = self.cfg.env.task_config.get(dataset)
        return conf.to_dict() if conf is not None else {}

    def param_state(self, states):
        from flax import nnx
        return nnx.state(self.learner.actor_def.merge(states.actor.params), nnx.Param)

    def sample(self, states, prompts, temperature: float | None = None) -> list:
        """One episode per prompt on the in-process engine (rollout sampling unless ``temperature``)."""
        import asyncio
        from sao.rollout.agent import run_episodes
        cfg = self.cfg
        sampling = self.sampling if temperature is None else self.sampling.replace(temperature=temperature)

        async def go():
            await self.engine.set_params(states.policy_version, self.param_state(states))
            return await run_episodes(self.engine, self.make_env, self.tokenizer, prompts, sampling,
                                      concurrency=cfg.rollout.max_concurrency,
                                      **episode_kwargs(cfg, self.tokenizer))
        return asyncio.run(go())

    def evaluate(self, states, step: int) -> dict:
        from sao.driver import pass_at_1
        m = pass_at_1(self.sample(states, self.heldout, temperature=self.cfg.eval.temperature))
        self.log(f"step {step}: held-out pass@1 {100 * m['eval/accuracy']:.1f}%, "
                 f"tool use {100 * m['eval/tool_use']:.1f}%")
        return m

    def cached_eval(self, states) -> dict:
        path = os.path.join(self.workdir, "eval_before.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        m = self.evaluate(states, 0)
        self.writer.write(0, m)
        write_json(path, m)
        return m

    def value_pretrain(self, states):
        from sao.learner import make_train_batch
        cfg, lc = self.cfg, self.learner.cfg
        n = cfg.critic.value_pretrain_trajectories
        if not lc.uses_critic or not lc.value_pretrain_steps or n < 1:
            return states
        import random
        prompts = random.Random(cfg.seed).sample(self.train_records, min(n, len(self.train_records)))
        trajs = self.sample(states, prompts)
        B = lc.batch_size
        batches = [make_train_batch(trajs[i:i + B], buckets=lc.length_buckets, batch_size=B,
                                    pad_id=lc.pad_id) for i in range(0, len(trajs), B)]
        states, res = self.learner.value_pretrain(states, batches)
        for i, ev in enumerate(res["history"]):
            self.writer.write(i, {"value_pretrain/explained_variance": ev}, phase="value_pretrain")
        self.log(f"value pretraining: {res['steps']} critic steps on {len(trajs)} trajectories, "
                 f"explained variance {res['explained_variance']:.3f}")
        return states

    # -- fleet and checkpoints ---------------------------------------------------
    def dispatcher(self, addresses, version: int, data_state):
        from sao.data.prompts import prompt_iterator
        from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
        from sao.rpc.auth import Security
        cfg = self.cfg
        it = prompt_iterator(self.train_records, seed=cfg.data.shuffle_seed,
                             state=(data_state or {}).get("prompts"))
        stream = _PromptStream(it, cfg.rollout.group_size)
        dcfg = DispatcherConfig(batch_size=cfg.learner.batch_size, vocab_size=self.tokenizer.vocab_size,
                                tau=cfg.rollout.tau, initial_version=version,
                                security=Security(token=_read_token(cfg.rollout.token_file)))
        d = Dispatcher(addresses, stream, dcfg)
        if data_state and data_state.get("dispatcher"):
            d.load_state_dict(data_state["dispatcher"])
        return d, stream

    def source(self, dispatcher):
        """What the loop pulls batches from: the dispatcher, or whole GRPO groups of it."""
        from sao.driver import GroupedSource
        g = self.cfg.rollout.group_size
        return dispatcher if g == 1 else GroupedSource(dispatcher, group_size=g,
                                                       batch_size=self.cfg.learner.batch_size)

    def save(self, checkpointer, states, step: int, *, data_state, extra) -> None:
        if step in checkpointer.all_steps():
            return
        checkpointer.save(step, train_state=states, policy_version=states.policy_version,
                          data_state=data_state, extra=extra, force=True)
        checkpointer.wait()

    def restore(self, checkpointer, states):
        r = checkpointer.restore(target=self.learner.abstract_states(states))
        return r.train_state, r.step, r.data_state


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)
