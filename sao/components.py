"""The run's components, made from an experiment config: learner config, tokenizer,
policy, tasks, environments, sampling, engines.

Pure construction, no processes or files: ``sao.workers`` (rollout worker
processes) and ``sao.train`` (the learner's phases) put them together.
"""
from __future__ import annotations

import ml_collections
from flax import nnx

from sao import sglang_setup
from sao.data.prompts import split_records
from sao.fleet.dispatch_config import DispatcherConfig
from sao.fleet.parity import ParityGate
from sao.fleet.probe import probe_sequences
from sao.envs import EpisodeConfig, env_factory, make_task
from sao.envs.latency import ToolLatency
from sao.envs.sandbox import SandboxLimits
from sao.learner.baselines import RunningMeanBaseline
from sao.learner.config import LearnerConfig
from sao.models import Transformer, create_sharded, from_pretrained, get_preset
from sao.models.tokenizer import ByteTokenizer
from sao.publishing import Publisher
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout.agent import byte_tool_format, chatml_tool_format
from sao.rollout.base import SamplingParams
from sao.rollout.jax_engine import JaxEngine


def learner_config(cfg: ml_collections.ConfigDict) -> LearnerConfig:
    """``LearnerConfig`` from the ``learner`` and ``critic`` groups (raises ValueError on unknown keys).

    ``temperature`` is ``rollout.temperature``: log pi_theta is computed at the sampling
    temperature (docs/algorithm.md §4), so it is derived here, after any override; ``seed``
    is the run's ``seed``. ``advantage_estimator="running_mean"`` becomes ``"given"``: the
    loop computes the advantages (``sao.learner.baselines.RunningMeanBaseline``, see
    :func:`running_mean_baseline`).
    """
    merged = {**cfg.learner.to_dict(), **cfg.critic.to_dict(),
              "temperature": cfg.rollout.temperature, "seed": cfg.seed}
    if merged["advantage_estimator"] == "running_mean":
        merged["advantage_estimator"] = "given"
    return LearnerConfig.from_config(merged)


def running_mean_baseline(cfg) -> RunningMeanBaseline | None:
    """``RunningMeanBaseline`` for ``learner.advantage_estimator="running_mean"``, else None.

    ``train.running_mean_window`` rewards per slot; ``train.running_mean_scope``:
    ``"prompt"`` (one slot per prompt) or ``"global"`` (the online setting).
    """
    if cfg.learner.advantage_estimator != "running_mean":
        return None
    return RunningMeanBaseline(cfg.train.running_mean_window, scope=cfg.train.running_mean_scope)


def make_tokenizer(cfg):
    """The byte-level tokenizer (``model.tokenizer="byte"``) or the one of ``model.init``.

    Only the tokenizer is read (``sao.models.tokenizer_loading.load_tokenizer``:
    ``tokenizer.json`` / ``config.json`` of an HF directory, or a GGUF file's
    metadata), never the weights: every process needs it, most never need the
    checkpoint. Raises FileNotFoundError / ValueError as ``load_tokenizer``.
    """
    if cfg.model.tokenizer == "byte":
        return ByteTokenizer()
    return load_tokenizer(cfg.model.init)


def make_policy(cfg, seed: int = 0, mesh=None):
    """The policy ``Transformer`` (preset, random init) or the HF / GGUF model at ``model.init``.

    With a ``mesh`` of more than one device, parameters are created straight on
    it with their rules' shardings (``from_pretrained(..., mesh=)``,
    ``create_sharded``): no device holds a whole model, and in a multi-process
    job each process creates only its own shards.
    """
    sharded = mesh is not None and mesh.size > 1
    remat = cfg.model.get("remat", False)   # absent from configs saved before it existed
    if cfg.model.init:
        model = from_pretrained(cfg.model.init, dtype=cfg.model.param_dtype,
                                mesh=mesh if sharded else None)[1]
        # not checkpoint fields
        model.cfg = model.cfg.replace(head_dtype=cfg.model.head_dtype, remat=remat)
        return model
    mcfg = get_preset(cfg.model.preset, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype,
                      head_dtype=cfg.model.head_dtype, remat=remat)
    if sharded:
        return create_sharded(lambda: Transformer(mcfg, rngs=nnx.Rngs(seed)), mesh)
    return Transformer(mcfg, rngs=nnx.Rngs(seed))


def make_tasks(cfg) -> dict:
    """``{task name: Task}`` from ``env.tasks`` (reasoning-gym specs ``rg/<dataset>`` and
    ``drift/<dataset>`` get ``env.task_config.<dataset>`` and ``env.grader``; ``humaneval``
    grades its tests under ``env.tool_timeout_s`` / ``env.tool_memory_mb``; ``swe/<tier>`` gets
    ``env.task_config.<tier>`` as ``make_swe_task`` keywords: ``seed``, ``per_repo``, and for
    ``swe/bench`` ``path``, ``checkouts``; not ``split``, which ``data.heldout_fraction`` does)."""
    tasks = {}
    for i, spec in enumerate(cfg.env.tasks):
        if spec.startswith(("rg/", "drift/")):
            conf = cfg.env.task_config.get(spec.split("/", 1)[1], ml_collections.ConfigDict()).to_dict()
            task = make_task(spec, size=cfg.env.task_size, seed=cfg.seed + i, config=conf,
                             grader=cfg.env.grader)
        elif spec == "humaneval":  # the task's tests run with the tool's sandbox limits
            task = make_task(spec, limits=SandboxLimits(timeout_s=cfg.env.tool_timeout_s,
                                                        memory_mb=cfg.env.tool_memory_mb))
        elif spec.startswith("swe/"):  # build settings of the tier: seed, per_repo
            conf = cfg.env.task_config.get(spec.split("/", 1)[1], ml_collections.ConfigDict()).to_dict()
            task = make_task(spec, **conf)
        else:
            task = make_task(spec)
        tasks[task.name] = task
    return tasks


def split_prompts(cfg, tasks: dict, *, evaluated_only: bool = True) -> tuple[list[dict], list[dict]]:
    """``(train records, held-out records)``: the tasks' prompts split by ``data.heldout_fraction``
    (seed ``data.split_seed``, ``sao.data.prompts.split_records``); the held-out ones cut to
    the ``eval.num_prompts`` that are evaluated, or all of them with ``evaluated_only=False``.

    Raises ValueError if fewer than ``eval.num_prompts`` prompts are held out.
    """
    records = [r for t in tasks.values() for r in t.records()]
    train_records, heldout = split_records(records, heldout_fraction=cfg.data.heldout_fraction,
                                           seed=cfg.data.split_seed)
    if len(heldout) < cfg.eval.num_prompts:
        raise ValueError(f"only {len(heldout)} held-out prompts < eval.num_prompts "
                         f"{cfg.eval.num_prompts}: raise env.task_size or data.heldout_fraction")
    return train_records, heldout[:cfg.eval.num_prompts] if evaluated_only else heldout


def tool_latency(cfg) -> ToolLatency:
    """``env.tool_latency_*`` / ``env.tool_failure_rate`` as a ``ToolLatency`` seeded by the
    run seed (off for configs that predate the fields). Raises ValueError on bad values."""
    e = cfg.env
    return ToolLatency(median_s=float(e.get("tool_latency_median_s", 0.0)),
                       sigma=float(e.get("tool_latency_sigma", 1.5)),
                       max_s=float(e.get("tool_latency_max_s", 30.0)),
                       failure_rate=float(e.get("tool_failure_rate", 0.0)), seed=int(cfg.seed))


def make_env_factory(cfg, tasks: dict, clock=None):
    """``() -> Env``: a ``ToolEnv``, or a ``DriftEnv`` when ``env.drift_schedule`` is set.

    ``clock() -> int`` is the learner step the drift env judges at (the engine's
    policy version); ``env.judge`` picks the drift judge.
    ``env.prompt_style="question"`` shows the question alone (tiny models).
    """
    e = cfg.env
    episode = EpisodeConfig(tool_format=e.tool_format, max_turns=cfg.rollout.max_turns,
                            max_tool_calls=e.max_tool_calls, tool_timeout_s=e.tool_timeout_s,
                            tool_memory_mb=e.tool_memory_mb,
                            max_observation_chars=e.max_observation_chars,
                            latency=tool_latency(cfg))
    make = env_factory(tasks, episode, drift_schedule=tuple(e.drift_schedule), clock=clock,
                       judge=e.judge)
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


def sampling_params(cfg, tokenizer) -> SamplingParams:
    """Rollout sampling (``rollout.temperature``, ``top_p``, ``top_k``, ``max_new_tokens``; stop at EOS)."""
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=(tokenizer.eos_id,))


def turn_format(cfg, tokenizer):
    """The agent loop's turn framing for ``env.tool_format`` (``"tags"``: byte level, else ChatML)."""
    return byte_tool_format(tokenizer) if cfg.env.tool_format == "tags" else chatml_tool_format(tokenizer)


def episode_kwargs(cfg, tokenizer) -> dict:
    """``run_episode`` keywords: ``max_turns``, ``max_total_tokens`` (``rollout.max_len``), ``turn_format``."""
    return dict(max_turns=cfg.rollout.max_turns, max_total_tokens=cfg.rollout.max_len,
                turn_format=turn_format(cfg, tokenizer))


# Version a rollout worker reports before the learner's first push: no learner version,
# so the dispatcher always syncs the learner's weights (its version 0 may be SFT'd) first.
NO_WEIGHTS_VERSION = -1


def make_engine(cfg, *, seed: int, sglang_url: str = "", model=None, worker_index: int = 0,
                log_dir: str = ""):
    """``JaxEngine`` over ``model`` or a rollout worker's ``SGLangEngine``.

    Without ``model`` (a rollout worker) the engine serves a fresh policy at
    version ``NO_WEIGHTS_VERSION`` until the learner pushes its weights. For
    ``rollout.engine="sglang"`` (``sao.sglang_setup.make_engine``) worker
    ``worker_index`` starts its own server (log in ``log_dir``) or attaches
    to ``sglang_url`` / ``rollout.sglang.url_file``; raises ValueError with
    neither, or with ``model`` (the learner holds no SGLang engine: its
    evaluation runs on the fleet, ``sao.evaluation.FleetSampler``).
    """
    version = 0 if model is not None else NO_WEIGHTS_VERSION
    if cfg.rollout.engine == "sglang":
        if model is not None:
            raise ValueError("an SGLang engine serves a rollout worker, not the learner's model")
        return sglang_setup.make_engine(cfg, worker_index=worker_index, version=version,
                                        sglang_url=sglang_url, log_dir=log_dir)
    return JaxEngine(model if model is not None else make_policy(cfg, seed),
                     max_slots=cfg.rollout.engine_slots, max_len=cfg.rollout.max_len, seed=seed,
                     version=version, serve_dtype=engine_dtype(cfg))


ENGINE_DTYPES = ("", "float32", "bfloat16", "float16")


def engine_dtype(cfg):
    """``rollout.engine_dtype`` as a dtype name, or None (serve the model's own
    dtypes; also when the config predates the field). Raises ValueError on
    a name outside ``ENGINE_DTYPES``."""
    name = cfg.rollout.get("engine_dtype", "")
    if name not in ENGINE_DTYPES:
        raise ValueError(f"rollout.engine_dtype must be one of {ENGINE_DTYPES}, got {name!r}")
    return name or None


def parity_gate(cfg, tokenizer) -> ParityGate | None:
    """The run's log-prob parity gate from ``rollout.parity`` (None when not
    ``enabled``): the probe set in the run's tokenizer and ``env.tool_format``,
    cut to ``rollout.max_len``; ``max_token_gap`` 0 means not checked. Raises
    ValueError on thresholds that are not > 0."""
    p = cfg.rollout.parity
    if not p.enabled:
        return None
    sequences = probe_sequences(tokenizer, tool_format=cfg.env.tool_format,
                                max_len=cfg.rollout.max_len)
    return ParityGate(sequences, max_mean_gap=p.max_mean_gap,
                      max_token_gap=p.max_token_gap or None, timeout_s=p.timeout_s)


EVAL_WHERE = ("auto", "learner", "fleet")


def samples_on_fleet(cfg) -> bool:
    """Whether held-out evaluation and the critic's value-pretraining samples
    run on the rollout fleet (``sao.evaluation.FleetSampler``) instead of an
    in-process ``JaxEngine``: ``eval.where="fleet"``, or ``"auto"`` with
    ``rollout.engine="sglang"`` (the learner holds no SGLang engine and needs
    no server URL). Raises ValueError for ``eval.where="learner"`` with SGLang
    engines or an unknown value."""
    where = cfg.eval.where
    if where not in EVAL_WHERE:
        raise ValueError(f"eval.where must be one of {EVAL_WHERE}, got {where!r}")
    if where == "learner" and cfg.rollout.engine == "sglang":
        raise ValueError("eval.where='learner' needs an in-process JaxEngine; with "
                         "rollout.engine='sglang' evaluation runs on the fleet ('fleet' or 'auto')")
    return where == "fleet" or (where == "auto" and cfg.rollout.engine == "sglang")


def publisher(cfg, learner, model_cfg, tokenizer, directory: str) -> Publisher:
    """The run's ``sao.publishing.Publisher`` into ``directory`` (cleared now):
    the actor's params, and the HF export with ``checkpoint.hf_export``. Raises
    ValueError for ``rollout.engine="sglang"`` without it (servers load HF exports)."""
    if cfg.rollout.engine == "sglang" and not cfg.checkpoint.hf_export:
        raise ValueError("rollout.engine='sglang' needs checkpoint.hf_export=True: "
                         "SGLang servers load the HF export of each publish")
    export = cfg.checkpoint.hf_export
    return Publisher(directory, lambda s: learner.actor_def.param_state(s.actor.params),
                     model_cfg=model_cfg if export else None, tokenizer=tokenizer if export else None)


def dispatcher_config(cfg, learner, tokenizer, security, *, initial_version: int) -> DispatcherConfig:
    """The fleet's ``DispatcherConfig``: batch and staleness from the learner,
    vocabulary from the tokenizer, the largest length bucket as the length
    bound, ``rollout.max_abs_reward``, ``weights_timeout_s``, ``lease_timeout_s``
    (0 = none) and ``max_broken_workers``, and ``security`` (token / TLS)."""
    r = cfg.rollout
    return DispatcherConfig(
        batch_size=learner.cfg.batch_size, vocab_size=tokenizer.vocab_size, tau=r.tau,
        initial_version=initial_version, max_length=max(learner.cfg.length_buckets),
        max_abs_reward=r.max_abs_reward, weights_timeout_s=r.weights_timeout_s,
        max_broken_workers=r.max_broken_workers, security=security,
        lease_timeout_s=r.get("lease_timeout_s", 600.0) or None)
