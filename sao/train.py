"""The learner's side of a run (``--role=learner``, and ``--role=all`` once its workers serve).

:func:`train` runs, in order:

1. SFT warm start of the policy on demonstrations (``sft.steps`` > 0);
2. held-out pass@1 of the starting policy;
3. value pretraining of the critic on samples of the starting policy (fresh runs);
4. asynchronous RL (``sao.rl_loop.train``) against the rollout workers, each
   of them checked by the log-prob parity gate (``rollout.parity``,
   ``sao.fleet.parity``) as it joins and after every push;
5. held-out pass@1 after RL; ``summary.json`` and a summary table, with where
   the wall time went (``sao.timing``: ``time/...`` keys and a second table).

Evaluation and value-pretraining samples run in process on a ``JaxEngine``, or on the
fleet (``sao.evaluation.FleetSampler``, ``eval.where``): the learner needs no server URL.

Every process of a multi-host learner (docs/multihost.md) runs this
function: all of them build the mesh, the states and every jitted step,
save and restore checkpoints and publish collectively; process 0 (the lead)
alone talks to the fleet, samples evaluations (``sao.lead_sampling``), writes
metrics, the summary and the JSON files, and sends each batch it takes to
the others (``sao.multihost``). ``run.record_batches`` keeps the batches the
learner trained on in ``replay.bin``; ``run.replay`` trains on such a file
instead of a fleet (``sao.fleet.replay``).

The resolved config goes to ``config.json`` first (``sao.analysis`` rebuilds it from
there). Every phase leaves its result in the workdir; a rerun resumes in this order:

* ``sft/`` (published weights + ``result.json``): loaded instead of training;
* ``eval_before.json``: read instead of evaluating again;
* ``ckpt/``: no checkpoint → value pretraining, then step 0 is saved; else the
  latest one is restored: actor and critic train states, policy version, and
  ``data_state`` = dispatcher state (buffered trajectories, prompts to
  re-issue, answered ids, fleet counters, the prompt stream's position with
  the not yet issued rest of a GRPO group), the GRPO rows held until their
  group is complete, and the running-mean baseline's buffers;
* ``publish/`` is cleared when the run's publisher is made
  (``sao.publishing``; a crashed run may have published ahead of its last
  checkpoint), then the restored version is published (with its HF export
  when ``checkpoint.hf_export``) and pushed to the
  workers before the first lease; RL continues at the checkpoint's step.

A run whose ``summary.json`` and latest checkpoint both stand at ``run.steps``
is finished: a rerun (`finished_summary`) prints that summary and changes
nothing, without starting workers or evaluating again; raise ``run.steps`` to
continue it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from typing import Callable

import jax
from rich.console import Console

from sao import (ckpt, components, multihost, provenance, rl_loop, run_metrics, sft, storage,
                 timing, workers)
from sao.data import demonstrations
from sao.data.prompts import PromptStream, prompt_iterator
from sao.data.swe_demos import issue_variant_records
from sao.envs import facts as env_facts
from sao.envs.drift import drift_summary
from sao.evaluation import FleetSampler, Sampler
from sao.fleet import lag_sources
from sao.fleet.dispatcher import Dispatcher
from sao.fleet.probe import ReferencePublisher
from sao.fleet.replay import ReplaySource, ReplayWriter
from sao.learner.batch import make_train_batch
from sao.learner.learner import Learner
from sao.learner.mesh import maybe_initialize_distributed, mesh_from_config
from sao.lead_sampling import LeadSampling
from sao.value_eval import make_value_eval

EVAL_BEFORE_FILE = "eval_before.json"
REPLAY_FILE = "replay.bin"


def train(cfg, workdir: str, *, addresses: list[str]) -> dict:
    """All learner phases (module doc) against the workers at ``addresses``; returns the summary.

    Raises ValueError without rollout workers (on the lead; ``run.replay`` needs
    none), TimeoutError if the fleet stalls. Processes other than the lead
    return ``{"process_index", "steps", "policy_version"}``.
    """
    maybe_initialize_distributed()
    lead = multihost.is_lead()
    if lead and not addresses and not cfg.run.replay:
        raise ValueError("no rollout workers: set rollout.worker_addresses or use --role=all")
    if cfg.sft.steps and multihost.process_count() > 1:
        raise ValueError("sft.steps > 0 needs a single-process learner: run the SFT warm start "
                         "with one process first, or start from its weights (model.init)")
    if cfg.run.record_batches and storage.is_remote(workdir):
        raise ValueError("run.record_batches writes replay.bin into a local work dir only")
    t0, cpu0, startup_s = time.perf_counter(), time.process_time(), timing.startup_s()
    clock, rl_clock = timing.Stopwatch(), timing.Stopwatch()   # phases; parts of the RL steps
    storage.makedirs(workdir)
    if lead:                                                # the resolved config, for analysis tools
        run_metrics.write_json(storage.join(workdir, run_metrics.CONFIG_FILE), cfg.to_dict())
        provenance.record_start(workdir)                   # code version, per start
    # Bad TLS paths fail here, not after SFT; the lead alone makes the token file.
    security = workers.fleet_security(cfg, workdir, create=True) if lead else None
    console = Console()

    def log(text: str) -> None:
        if lead:
            console.print(f"[bold cyan]sao[/] {text}")

    with (run_metrics.MetricsWriter(workdir, tensorboard=cfg.run.tensorboard,
                                    wandb_project=cfg.run.get("wandb_project", ""), run_name=cfg.name,
                                    run_config=cfg.to_dict()) if lead
          else run_metrics.NullWriter()) as writer:
        tokenizer = components.make_tokenizer(cfg)
        tasks = components.make_tasks(cfg)
        train_records, held_all = components.split_prompts(cfg, tasks, evaluated_only=False)
        heldout = held_all[:cfg.eval.num_prompts]
        train_records = issue_variant_records(  # swe/: other hints, never a held-out text
            train_records, cfg.data.get("issue_variants", 0), seed=cfg.data.shuffle_seed,
            exclude_texts={r["text"] for r in held_all})
        multihost.sync("start")                            # the lead spawned workers, wrote files
        mesh = mesh_from_config(cfg.model.mesh)            # every device of every process
        policy = components.make_policy(cfg, cfg.seed, mesh=mesh)
        # 1. SFT warm start (cached in sft/).
        if cfg.sft.steps:
            with clock.part("sft"):
                sft_warm_start(cfg, policy, tokenizer, workdir, writer, log)
        learner = Learner(components.learner_config(cfg), mesh, policy)
        states = learner.init_states()
        publish = components.publisher(cfg, learner, policy.cfg, tokenizer,  # clears publish/
                                       workers.publish_root(cfg, workdir))
        gate = components.parity_gate(cfg, tokenizer)      # servers must score as the learner
        if gate is not None:                               # each published version is scored here
            publish = ReferencePublisher(publish, params_of=lambda s: s.actor.params,
                                         model_of=learner.actor_def.merge, gate=gate)
        on_fleet = components.samples_on_fleet(cfg)
        if not lead:                                       # processes 1..: the lead samples
            sampler = None
        elif on_fleet:                                     # SGLang engines: the learner holds none
            sampler = FleetSampler(addresses, dataclasses.replace(components.dispatcher_config(
                cfg, learner, tokenizer, security, initial_version=states.policy_version),
                parity=gate), publish,
                temperature=cfg.rollout.temperature, timeout_s=cfg.run.batch_timeout_s)
        else:
            engine = components.make_engine(cfg, seed=cfg.seed + 7, model=policy)  # in process
            sampler = Sampler(engine, components.make_env_factory(
                                  cfg, tasks, clock=components.engine_clock(lambda: engine)),
                              tokenizer, components.sampling_params(cfg, tokenizer),
                              param_state=lambda s: learner.actor_def.param_state(s.actor.params),
                              concurrency=cfg.rollout.max_concurrency,
                              **components.episode_kwargs(cfg, tokenizer))

        sampler = LeadSampling(sampler, in_process=not on_fleet, publish=publish)

        value_eval = make_value_eval(cfg, learner, sampler, heldout, workdir, log)

        def evaluate(states, step: int) -> dict:
            k = cfg.eval.samples_per_prompt   # each held-out prompt k times, as groups 0..k-1
            m = sampler.pass_at_1(states, [{**p, "group": j} for p in heldout for j in range(k)],
                                  temperature=cfg.eval.temperature)
            if m:                                          # the lead's metrics
                m.update(value_eval(states))               # critics on one fixed episode set
                log(f"step {step}: held-out pass@1 {100 * m['eval/accuracy']:.1f}%, "
                    f"tool use {100 * m['eval/tool_use']:.1f}%")
            return m

        # 2. Held-out evaluation of the starting policy (cached in eval_before.json; the
        # lead decides, as every process must evaluate or none).
        before = multihost.broadcast_json(
            read_json(storage.join(workdir, EVAL_BEFORE_FILE)) if lead else None)
        if before is None:
            with clock.part("eval_before"):
                before = evaluate(states, 0)
            writer.write(0, before)
            if lead:
                run_metrics.write_json(storage.join(workdir, EVAL_BEFORE_FILE), before)
        # 3. Value pretraining on a fresh run; otherwise restore the latest checkpoint.
        checkpointer = ckpt.Checkpointer(storage.join(workdir, "ckpt"), max_to_keep=cfg.checkpoint.keep)
        if checkpointer.latest_step() is None:
            with clock.part("value_pretrain"):
                states = value_pretrain(cfg, learner, states, sampler, train_records, writer, log,
                                        clock=clock)
            save(checkpointer, states, 0, data_state=None)
            start_step, data_state = 0, {}
        else:
            restored = checkpointer.restore(target=learner.abstract_states(states))
            states, start_step = restored.train_state, restored.step
            data_state = restored.data_state or {}
            note = f"resumed at step {start_step} (policy version {states.policy_version})"
            if multihost.process_count() > 1:              # every process says where it resumed
                note = f"process {jax.process_index()}: {note}"
                console.print(f"[bold cyan]sao[/] {note}")
            else:
                log(note)
        # 4. Asynchronous RL against the fleet.
        with clock.part("rl"):
            states, steps_done, fleet = reinforce(
                cfg, learner, states, addresses, train_records, tokenizer, start_step=start_step,
                data_state=data_state, checkpointer=checkpointer, evaluate=evaluate,
                workdir=workdir, writer=writer, security=security, publish=publish,
                sampler=sampler, timer=rl_clock, parity=gate)
            checkpointer.close()
        # 5. Held-out evaluation after RL.
        with clock.part("eval_after"):
            after = evaluate(states, steps_done)
        writer.write(steps_done, after)
    if not lead:
        return {"process_index": jax.process_index(), "steps": steps_done,
                "policy_version": states.policy_version}
    summary = run_metrics.run_summary(workdir, before=before, after=after, fleet=fleet,
                                      eval_prompts=len(heldout), steps=steps_done,
                                      samples_per_prompt=cfg.eval.samples_per_prompt,
                                      batch_size=cfg.learner.batch_size,
                                      policy_version=states.policy_version)
    if cfg.env.drift_schedule:                              # online env: adaptation per switch
        summary["drift"] = drift_summary(
            [r for r in run_metrics.read_metrics(workdir) if r["phase"] == "rl"],
            tuple(cfg.env.drift_schedule), recovery_fraction=cfg.env.drift_recovery_fraction,
            window=cfg.env.drift_recovery_window)
        log(f"drift: adaptation lag per switch {summary['drift']['adaptation_lag']} "
            f"(policy versions), reward per phase {summary['drift']['phase_reward']}")
    wall_s = time.perf_counter() - t0
    learner_cpu_s, workers_cpu_s = timing.cpu_s()
    summary.update({"wall_s": round(wall_s, 1), **timing.breakdown(
                        clock, rl_clock, wall_s=wall_s, cpu_s=time.process_time() - cpu0),
                    "time/startup_s": round(startup_s, 1), "time/learner_cpu_s": round(learner_cpu_s, 1),
                    "time/workers_cpu_s": round(workers_cpu_s, 1)})
    run_metrics.write_json(storage.join(workdir, run_metrics.SUMMARY_FILE), summary)
    console.print(run_metrics.summary_table(summary))
    console.print(timing.table(summary))
    return summary


def critic_only_steps(cfg, learner_cfg) -> int:
    """Learner steps that update the critic alone (``critic.critic_warmup_steps`` with a critic)."""
    return int(learner_cfg.critic_warmup_steps) if learner_cfg.uses_critic else 0


def sft_warm_start(cfg, policy, tokenizer, workdir: str, writer, log: Callable[[str], None]) -> None:
    """Phase 1: ``sft.steps`` of SFT on reasoning-gym demonstrations, or for ``sft.task="swe/..."``
    the scripted fixes of the training split's repository tasks (``sao.envs.swe.swe_demonstrations``;
    ``sao.sft.cached_sft``), in place."""
    s = cfg.sft
    conf = cfg.env.task_config.get(s.task)                 # generator settings of the RL task, if any

    def make_data():
        if s.task.startswith("swe/"):  # scripted fixes of the training split's repository tasks
            from sao.data.swe_demos import swe_sft_demos
            train, held = components.split_prompts(cfg, components.make_tasks(cfg),
                                                    evaluated_only=False)
            demos = swe_sft_demos(train, task=s.task, fmt=cfg.env.tool_format, limit=s.num_demos,
                                  log=log, issue_variants_per_task=s.get("issue_variants", 0), seed=s.seed,
                                  exclude_texts={r["text"] for r in held})
        else:
            demos = demonstrations.arithmetic_demonstrations(
                s.num_demos, seed=s.seed, tool_fraction=s.tool_fraction, task=s.task,
                task_kwargs=conf.to_dict() if conf is not None else {},
                style_mix=demonstrations.parse_style_mix(s.get("style_mix", "")))
        return demonstrations.tokenize_demonstrations(demos, tokenizer, max_len=s.max_len)

    log(f"SFT warm start: {s.steps} steps on " + (f"the scripted fixes of {s.task}" if
        s.task.startswith("swe/") else f"{s.num_demos} demonstrations "
        f"({100 * s.tool_fraction:.0f}% call the tool)"))
    res = sft.cached_sft(policy, workdir, make_data, steps=s.steps, batch_size=s.batch_size,
                         lr=s.lr, warmup_steps=s.warmup_steps, seed=s.seed,
                         log=lambda step, m: writer.write(step, m, phase="sft"))
    log(f"SFT {'loaded from cache' if res['sft/cached'] else 'done'}: loss {res['sft/loss']:.3f}")


def value_pretrain(cfg, learner, states, sampler: Sampler, train_records: list[dict], writer,
                   log: Callable[[str], None], *, clock: timing.Stopwatch | None = None):
    """Phase 3: fits the critic on ``train.value_pretrain_trajectories`` samples of the starting
    policy (``Learner.value_pretrain``); returns the states (unchanged without a critic).
    ``clock`` gets the seconds of ``value_pretrain/sample`` and ``value_pretrain/fit``."""
    lc, n = learner.cfg, cfg.train.value_pretrain_trajectories
    if not lc.uses_critic or not lc.value_pretrain_steps or n < 1:
        return states
    clock = timing.Stopwatch() if clock is None else clock
    prompts = random.Random(cfg.seed).sample(train_records, min(n, len(train_records)))
    with clock.part("value_pretrain/sample"):
        trajs = sampler.sample(states, prompts)
    B = lc.batch_size
    with clock.part("value_pretrain/fit"):                 # ends with the metrics on the host
        batches = [make_train_batch(trajs[i:i + B], buckets=lc.length_buckets, batch_size=B,
                                    pad_id=lc.pad_id) for i in range(0, len(trajs), B)]
        states, res = learner.value_pretrain(states, batches)
    for i, ev in enumerate(res["history"]):
        writer.write(i, {"value_pretrain/explained_variance": ev,
                         **({"value_pretrain/trajectories": len(trajs)} if i == 0 else {})},
                     phase="value_pretrain")
    log(f"value pretraining: {res['steps']} critic steps on {len(trajs)} trajectories, "
        f"explained variance {res['explained_variance']:.3f}")
    return states


def reinforce(cfg, learner, states, addresses: list[str], train_records: list[dict], tokenizer, *,
              start_step: int, data_state: dict, checkpointer, evaluate, workdir: str, writer,
              security, publish, sampler, timer: timing.Stopwatch | None = None, parity=None):
    """Phase 4: the RL loop from ``start_step`` with a dispatcher over ``addresses``.

    ``data_state`` is the restored checkpoint's (``{}`` on a fresh run);
    ``security`` the fleet's token / TLS (``workers.fleet_security``);
    ``publish(states, version) -> uri`` the run's ``sao.publishing.Publisher``;
    ``sampler`` (``evaluate``'s) samples through this dispatcher meanwhile; ``timer``
    gets the RL loop's parts (``rl_loop.train``), the first push and the last
    checkpoint included; ``parity`` the dispatcher's log-prob parity gate (``sao.fleet.parity``,
    None: none). Returns ``(states, steps done, the dispatcher's final snapshot)``.

    Only the lead has a dispatcher (or, with ``run.replay``, a ``ReplaySource``);
    with several processes each batch it takes goes to all (``multihost.BatchBroadcast``,
    received by ``multihost.FollowerSource``), and all publish and checkpoint together.
    """
    timer = timing.Stopwatch() if timer is None else timer
    lead = multihost.is_lead()
    baseline = components.running_mean_baseline(cfg)      # running-mean advantages, or None
    if baseline is not None and data_state.get("baseline"):  # every process: same batches, same state
        baseline.load_state_dict(data_state["baseline"])
    dispatcher = groups = None
    if not lead:
        source = multihost.FollowerSource()
    elif cfg.run.replay:                                   # a recorded run's batches, no fleet
        source = ReplaySource(cfg.run.replay, initial_version=states.policy_version)
    else:
        # The dispatcher's state holds the stream's position (with the rest of a GRPO group);
        # "prompts" is where checkpoints written before kept the position alone.
        stream = PromptStream(prompt_iterator(train_records, seed=cfg.data.shuffle_seed,
                                              state=data_state.get("prompts")), cfg.rollout.group_size,
                              records=train_records)    # a dropped GRPO group is issued again
        source = dispatcher = Dispatcher(addresses, stream, dataclasses.replace(
            components.dispatcher_config(cfg, learner, tokenizer, security,
                                         initial_version=states.policy_version), parity=parity))
        if data_state.get("dispatcher"):
            dispatcher.load_state_dict(data_state["dispatcher"])
        group_size = cfg.rollout.group_size
        groups = None if group_size == 1 else rl_loop.GroupBatcher(   # GRPO: whole groups per batch,
            dispatcher.get_batch, group_size=group_size,             # each within tau at batch time
            batch_size=cfg.learner.batch_size, version=lambda: dispatcher.learner_version,
            tau=cfg.rollout.tau, resample=stream.resample)
        if groups is not None and data_state.get("groups"):
            groups.load_state_dict(data_state["groups"])
    next_batch = groups
    with contextlib.ExitStack() as stack:
        if lead and cfg.run.record_batches:                # what the learner trains on, cut at resume
            record = stack.enter_context(ReplayWriter(storage.join(workdir, REPLAY_FILE),
                                                      max_batches=start_step))
            next_batch = recorded(next_batch or source.get_batch, record, source)
        if lead and multihost.process_count() > 1:
            next_batch = multihost.BatchBroadcast(next_batch or source.get_batch)
        with timer.part("publish"):
            source.push_weights(states.policy_version, publish(states, states.policy_version))

        def checkpoint(s, step: int) -> None:
            save(checkpointer, s, step, data_state=None if not lead else {
                "dispatcher": dispatcher.state_dict() if dispatcher is not None else None,
                "groups": groups.state_dict() if groups is not None else None,
                "baseline": baseline.state_dict() if baseline is not None else None})

        def batch_metrics(trajs) -> dict:
            lag = ({} if dispatcher is None
                   else lag_sources.lag_source_metrics(trajs, dispatcher.learner_version))
            return {**env_facts.env_metrics(trajs), **lag,
                    **(groups.metrics() if groups is not None else {})}

        loop = rl_loop.LoopConfig(steps=cfg.run.steps, push_every=cfg.rollout.push_every,
                                  eval_every=cfg.eval.every, checkpoint_every=cfg.checkpoint.every,
                                  batch_timeout_s=cfg.run.batch_timeout_s,
                                  eval_offset=critic_only_steps(cfg, learner.cfg)
                                  if cfg.eval.align_actor_updates else 0)
        if dispatcher is not None:
            stack.enter_context(dispatcher)
            stack.enter_context(sampler.using(dispatcher))
        bar = stack.enter_context(run_metrics.Progress(
            cfg.run.steps, description="SAO", enabled=cfg.run.progress and lead,
            keys=("rollout/reward", "rollout/tool_use", "eval/accuracy",
                  "critic/explained_variance")))
        bar.update(start_step)
        hooks = rl_loop.LoopHooks(
            publish=publish, write=writer.write, evaluate=evaluate, checkpoint=checkpoint,
            on_step=bar.update, advantages=baseline, batch_metrics=batch_metrics,
            next_batch=next_batch)
        states, steps_done, counts = rl_loop.train(learner, states, source, loop=loop,
                                                   start_step=start_step, hooks=hooks, timer=timer)
        with timer.part("checkpoint"):
            checkpoint(states, steps_done)
    if dispatcher is None:                                 # replay (or not the lead): this run's counts
        return states, steps_done, {"trained": counts["trajectories"], "dropped": 0,
                                    **source.snapshot()}
    return states, steps_done, dispatcher.snapshot()  # counts are cumulative over resumes


def recorded(next_batch, writer: ReplayWriter, source):
    """``next_batch`` that also appends each batch to ``writer`` with the
    version last pushed to ``source`` (what ``ReplaySource`` checks on replay)."""
    def get(timeout: float | None = None):
        trajs = next_batch(timeout)
        if trajs:
            writer.write_batch(trajs, learner_version=source.learner_version)
        return trajs
    return get


def save(checkpointer, states, step: int, *, data_state) -> None:
    """Saves the train states at ``step`` (once per step) and waits for the write."""
    if step in checkpointer.all_steps():
        return
    checkpointer.save(step, train_state=states, policy_version=states.policy_version,
                      data_state=data_state, extra={}, force=True)
    checkpointer.wait()


def finished_summary(cfg, workdir: str) -> dict | None:
    """The summary of a finished run in ``workdir``, else None.

    Finished: ``summary.json`` reports ``run.steps`` steps and the latest
    checkpoint is step ``run.steps`` (a run extended with a larger
    ``run.steps``, or one that crashed after its summary, is not finished).
    Reads files only; every process of a job decides the same from the same
    workdir.
    """
    summary = read_json(storage.join(workdir, run_metrics.SUMMARY_FILE))
    if summary is None or summary.get("steps") != cfg.run.steps:
        return None
    ckpt_dir = storage.join(workdir, "ckpt")
    if not storage.exists(ckpt_dir):
        return None
    checkpointer = ckpt.Checkpointer(ckpt_dir, max_to_keep=cfg.checkpoint.keep)
    try:
        return summary if checkpointer.latest_step() == cfg.run.steps else None
    finally:
        checkpointer.close()


def read_json(path: str) -> dict | None:
    """The JSON object in ``path`` (local or ``gs://``), or None if there is no such file."""
    if not storage.exists(path):
        return None
    return json.loads(storage.read_text(path))
