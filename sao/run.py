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

import ml_collections

# Keys of the ``learner`` / ``critic`` groups that the driver reads, not LearnerConfig.
DRIVER_KEYS = ("running_mean_window", "running_mean_scope", "value_pretrain_trajectories")


def learner_config(cfg: ml_collections.ConfigDict):
    """``LearnerConfig`` from the ``learner`` and ``critic`` groups (raises ValueError on unknown keys).

    ``temperature`` is ``rollout.temperature``: log pi_theta is computed at the sampling
    temperature (ALGORITHM.md section 4), so it is derived here, after any override.
    ``advantage_estimator="running_mean"`` becomes ``"given"``: the driver computes the
    advantages (``sao.learner.baselines.RunningMeanBaseline``, see :func:`running_mean_baseline`).
    """
    import dataclasses
    from sao.learner import LearnerConfig
    merged = {**cfg.learner.to_dict(), **cfg.critic.to_dict(), "temperature": cfg.rollout.temperature}
    if "seed" in {f.name for f in dataclasses.fields(LearnerConfig)}:
        merged["seed"] = cfg.seed
    if merged.get("advantage_estimator") == "running_mean":
        merged["advantage_estimator"] = "given"
    return LearnerConfig.from_config({k: v for k, v in merged.items() if k not in DRIVER_KEYS})


def running_mean_baseline(cfg):
    """``RunningMeanBaseline`` for ``learner.advantage_estimator="running_mean"``, else None.

    ``learner.running_mean_window`` rewards per slot; ``learner.running_mean_scope``:
    ``"prompt"`` (one slot per prompt, default) or ``"global"`` (the online setting).
    """
    if cfg.learner.advantage_estimator != "running_mean":
        return None
    from sao.learner.baselines import RunningMeanBaseline
    return RunningMeanBaseline(cfg.learner.running_mean_window,
                               scope=cfg.learner.get("running_mean_scope", "prompt"))


def make_tokenizer(cfg):
    from sao.models.tokenizer import ByteTokenizer
    if cfg.model.tokenizer == "byte":
        return ByteTokenizer()
    from sao.models import from_pretrained
    return from_pretrained(cfg.model.init)[2]


def make_policy(cfg, seed: int = 0):
    """The policy ``Transformer`` (preset, random init) or the HF / GGUF model at ``model.init``."""
    from flax import nnx
    from sao.models import Transformer, from_pretrained, get_preset
    if cfg.model.init:
        return from_pretrained(cfg.model.init, dtype=cfg.model.param_dtype)[1]
    mcfg = get_preset(cfg.model.preset, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype)
    return Transformer(mcfg, rngs=nnx.Rngs(seed))


def make_tasks(cfg) -> dict:
    """``{task name: Task}`` from ``env.tasks`` (reasoning-gym specs ``rg/<dataset>`` and
    ``drift/<dataset>`` get ``env.task_config.<dataset>``)."""
    from sao.envs import make_task
    tasks = {}
    for i, spec in enumerate(cfg.env.tasks):
        if spec.startswith(("rg/", "drift/")):
            conf = cfg.env.task_config.get(spec.split("/", 1)[1], ml_collections.ConfigDict()).to_dict()
            task = make_task(spec, size=cfg.env.task_size, seed=cfg.seed + i, config=conf,
                             grader=cfg.env.grader)
        else:
            task = make_task(spec)
        tasks[task.name] = task
    return tasks


def make_env_factory(cfg, tasks: dict, clock=None):
    """``() -> Env``: a ``ToolEnv``, or a ``DriftEnv`` when ``env.drift_schedule`` is set.

    ``clock() -> int`` is the learner step the drift env judges at (the engine's
    policy version); ``env.judge`` (default ``"rule"``) picks the drift judge.
    ``env.prompt_style="question"`` shows the question alone (tiny models).
    """
    from sao.envs import EpisodeConfig, env_factory
    e = cfg.env
    episode = EpisodeConfig(tool_format=e.tool_format, max_turns=cfg.rollout.max_turns,
                            max_tool_calls=e.max_tool_calls, tool_timeout_s=e.tool_timeout_s,
                            tool_memory_mb=e.tool_memory_mb,
                            max_observation_chars=e.max_observation_chars)
    make = env_factory(tasks, episode, drift_schedule=tuple(e.get("drift_schedule", ())),
                       clock=clock, judge=e.get("judge", "rule"))
    if e.prompt_style != "question":
        return make

    def make_question_env():
        env = make()
        reset = env.reset

        def question_reset(prompt):
            reset(prompt)
            return prompt["text"] + "\n"
        env.reset = question_reset
        return env
    return make_question_env


def engine_clock(get_engine):
    """``() -> int``: the policy version of ``get_engine()`` (0 before the first push)."""
    return lambda: max(0, int(get_engine().version))


def env_metrics(trajs) -> dict:
    """``env/...`` means of the drift env's trajectory metadata (``{}`` without a drift env)."""
    import numpy as np
    drift = [t.metadata for t in trajs if "phase" in t.metadata]
    if not drift:
        return {}
    return {"env/learner_step": float(max(m["learner_step"] for m in drift)),
            "env/phase": float(max(m["phase"] for m in drift)),
            "env/phase_mean": float(np.mean([m["phase"] for m in drift])),
            "env/quality": float(np.mean([m["quality"] for m in drift])),
            "env/style_ok": float(np.mean([m["style_ok"] for m in drift]))}


def sampling_params(cfg, tokenizer):
    from sao.rollout.base import SamplingParams
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=(tokenizer.eos_id,))


def turn_format(cfg, tokenizer):
    from sao.rollout.agent import byte_tool_format, chatml_tool_format
    return byte_tool_format(tokenizer) if cfg.env.tool_format == "tags" else chatml_tool_format(tokenizer)


def episode_kwargs(cfg, tokenizer) -> dict:
    return dict(max_turns=cfg.rollout.max_turns, max_total_tokens=cfg.rollout.max_len,
                turn_format=turn_format(cfg, tokenizer))


# Version a rollout worker reports before the learner's first push: no learner version,
# so the dispatcher always syncs the learner's weights (its version 0 may be SFT'd) first.
NO_WEIGHTS_VERSION = -1


def make_engine(cfg, *, seed: int, sglang_url: str = "", model=None):
    """``JaxEngine`` over ``model`` or ``SGLangEngine``.

    Without ``model`` (a rollout worker) the engine serves a fresh policy at
    version ``NO_WEIGHTS_VERSION`` until the learner pushes its weights.
    """
    version = 0 if model is not None else NO_WEIGHTS_VERSION
    if cfg.rollout.engine == "sglang":
        from sao.rollout.sglang_engine import SGLangEngine
        if not sglang_url:
            raise ValueError("rollout.engine='sglang' needs --sglang_url")
        return SGLangEngine(sglang_url, version=version)
    from sao.rollout.jax_engine import JaxEngine
    return JaxEngine(model if model is not None else make_policy(cfg, seed),
                     max_slots=cfg.rollout.engine_slots, max_len=cfg.rollout.max_len, seed=seed,
                     version=version)


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
        return {"accuracy_before": before["eval/accuracy"], "accuracy_after": after["eval/accuracy"],
                "tool_use_before": before["eval/tool_use"], "tool_use_after": after["eval/tool_use"],
                "steps": steps_done, "trajectories": fleet["trained"],
                "dropped": fleet["dropped"], "eval_prompts": len(self.heldout),
                "policy_version": states.policy_version}

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
            await self.engine.load_weights(states.policy_version, self.param_state(states))
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
