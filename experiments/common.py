"""Shared defaults of every experiment: SAO as the paper runs it (arXiv 2607.07508).

Experiment files call :func:`base` and state only what differs, then
:func:`finalize` (derived values, lock). Groups, one per subsystem:

* ``model``      which policy / critic network and how it is placed on devices;
* ``learner``    actor-side keys of ``sao.learner.LearnerConfig`` (batch, advantages, loss, actor optimiser);
* ``critic``     critic-side keys of ``LearnerConfig`` (K, warm-up, frozen attention, value pretraining);
* ``train``      the learner process's keys outside ``LearnerConfig`` (value pretraining data, running mean);
* ``rollout``    engine, sampling, fleet size, staleness bound, weight pushes;
* ``env``        tasks, tool format and sandbox limits;
* ``data``       prompt splits and seeds;
* ``sft``        optional warm start by supervised fine-tuning on demonstrations;
* ``eval``       held-out evaluation;
* ``checkpoint`` orbax checkpoints and fleet publishes;
* ``run``        total steps, logging.

``learner`` and ``critic`` are made from ``LearnerConfig``'s defaults
(``sao.learner.config.experiment_groups``), so the two cannot disagree;
``sao.components.learner_config(cfg)`` merges them back and adds ``temperature``
= ``rollout.temperature`` (log-probs at the sampling temperature) and ``seed``.
``train`` holds what the learner process reads outside ``LearnerConfig`` (value
pretraining data, the running-mean baseline).
``model.preset`` names a ``sao.models.get_preset`` preset; full-scale presets are Qwen3 models served
by an SGLang fleet (``rollout.engine = "sglang"``) on TPU / GPU meshes.
"""
from __future__ import annotations

import ml_collections

from sao import config_checks
from sao.learner.config import experiment_groups

# Full-scale batch of the paper's main run (Qwen3-30B-A3B, math with a Python tool).
PAPER_BATCH = 128          # trajectories per learner step, one per prompt


def base() -> ml_collections.ConfigDict:
    """SAO defaults at full scale (Qwen3-30B-A3B, math + Python tool); unlocked."""
    c = ml_collections.ConfigDict()
    c.name = "sao"                        # run name (metrics, logs)
    c.seed = 0                            # one seed for init, sampling, prompt order

    # --- model ---------------------------------------------------------------
    c.model = m = ml_collections.ConfigDict()
    m.preset = "qwen3-30b-a3b"            # sao.models.get_preset name
    m.init = ""                           # HF dir / .gguf to start from ("" = preset's random init)
    m.param_dtype = "bfloat16"            # parameter storage dtype
    m.dtype = "bfloat16"                  # activation dtype (log-softmax stays f32)
    m.head_dtype = "float32"              # LM head matmul operands, f32 accumulation either way
    m.remat = False                       # recompute each block in the backward pass: activation
                                          # memory of one block, ~1/3 more learner compute
    m.tokenizer = "hf"                    # "byte" (tiny presets) or "hf" (tokenizer.json next to init)
    m.mesh = ml_collections.ConfigDict()
    m.mesh.data = 1                       # data-parallel axis size
    m.mesh.fsdp = -1                      # fully-sharded axis size (params + optimiser state; -1 = the rest)
    m.mesh.tensor = 1                     # tensor-parallel axis size
    m.mesh.expert = 1                     # expert-parallel axis size (MoE)

    # --- learner / critic: LearnerConfig's fields with its defaults (each one is documented in
    # sao/learner/config.py: the paper's SAO settings); here only what full scale sets otherwise.
    c.learner, c.critic = experiment_groups()
    l = c.learner
    l.batch_size = PAPER_BATCH            # B trajectories per step, B distinct prompts (paper 128)
    l.length_buckets = (4096, 8192, 16384, 32768)  # padded sequence lengths T (one compile each)
    l.micro_batch_size = 8                # rows per gradient-accumulation micro-batch (0 = whole batch)
    l.pad_id = 0                          # padding id (set from the tokenizer in finalize)
    l.deterministic = True                # bit-reproducible steps (full_scale turns it off)

    # --- train: the learner process's own knobs (sao.train), outside LearnerConfig ------
    c.train = t = ml_collections.ConfigDict()
    t.value_pretrain_trajectories = 512   # trajectories of the initial policy the critic is pretrained on
    t.running_mean_window = 8             # running-mean baseline: rewards kept per slot
    t.running_mean_scope = "prompt"       # running-mean slots: "prompt" (one per prompt) | "global" (one)

    # --- rollout -------------------------------------------------------------
    c.rollout = r = ml_collections.ConfigDict()
    r.engine = "sglang"                   # "jax" (in-process JaxEngine) | "sglang" (HTTP servers)
    r.num_workers = 16                    # rollout worker processes (one engine each)
    r.worker_start_timeout_s = 1800.0     # local workers (`--role=all`) serving by then, or the run
                                          # stops (a worker that exits stops it at once); a nice'd
                                          # sweep on a loaded 2-core machine took > 300 s to import
    r.max_concurrency = 64                # episodes run at once per worker
    r.engine_slots = 64                   # JaxEngine decode slots (continuous batching)
    r.max_len = 32768                     # longest trajectory (tokens), prompt included
    r.temperature = 1.0                   # sampling temperature; the learner uses logits / T too
    r.top_p = 1.0                         # nucleus sampling (1 = off); the JAX engine reports truncated log-probs
    r.top_k = 0                           # top-k sampling (0 = off)
    r.engine_dtype = ""                   # JaxEngine: dtype its weights are served in ("" = the model's;
                                          # "bfloat16" beside an f32 learner = production's mismatch)
    r.max_new_tokens = 8192               # tokens per engine turn
    r.max_turns = 16                      # policy turns per episode
    r.group_size = 1                      # rollouts per prompt (1 = single rollout; GRPO 8)
    r.tau = 4                             # staleness bound: drop if learner - oldest version > τ
    r.push_every = 1                      # push weights to the fleet every N learner steps
    r.weights_timeout_s = 900.0           # learner: one UpdateWeights (a server restart takes minutes)
    r.max_broken_workers = 0              # learner: workers that may break (engine gave up) before FleetError
    # Log-prob parity gate (docs/fleet.md "Log-prob parity gate"): each server scores a fixed probe
    # set at start-up and after every weight push; one that disagrees with the learner is quarantined.
    r.parity = p = ml_collections.ConfigDict()
    p.enabled = True                      # learner: check every server (False: trust them)
    p.max_mean_gap = 0.1                  # nats: most mean |server - learner| log-prob per probe token
                                          # (SmolLM2: bf16 server vs f32 learner 0.03; wrong rope theta 0.26)
    p.max_token_gap = 0.0                 # nats: most |gap| on any probe token (0 = not checked)
    p.timeout_s = 300.0                   # one Score rpc (a probe is one forward pass per sequence)
    # SGLang servers of rollout.engine="sglang" (docs/rollout.md "Workers and their servers"): each
    # worker starts and supervises its own server from this command, or attaches to one by URL.
    r.sglang = g = ml_collections.ConfigDict()
    g.python = ""                         # the SGLang environment's interpreter ("" = attach by URL)
    g.module = "sglang.launch_server"     # "sglang.launch_server" (PyTorch) | "sgl_jax.launch_server"
    g.args = ""                           # extra server flags, shell-quoted ("--tp 2 --dtype bfloat16")
    g.env = ""                            # extra server environment, shell-quoted "K=V K2=V2"
    g.python_path = ""                    # directories put first on the server's PYTHONPATH (":"-separated)
    g.host = "127.0.0.1"                  # where the server listens (its worker talks to it)
    g.port = 0                            # worker i's server port is port + i (0 = any free port)
    g.reload = ""                         # "update_weights_from_disk" | "restart" ("" = restart for sgl_jax)
    g.reload_timeout_s = 120.0            # one /update_weights_from_disk attempt
    g.ready_timeout_s = 900.0             # a server start or restart, until it answers
    g.nice = 0                            # the server's niceness, 0-19 (launch/sglang_fleet.py
                                          # --device=cpu --backend=jax: 10, docs/rollout.md)
    g.max_reload_failures = 3             # loads failing in a row before the worker reports itself unusable
    g.request_timeout_s = 600.0           # one /generate attempt
    g.url_file = ""                       # attach: server URLs one per line, worker i takes line i
    r.worker_addresses = ""               # comma-separated host:port of remote workers ("" = spawn locally)
    # Fleet security (docs/fleet.md "Security"): every run has a token; TLS is set by file paths.
    r.token_file = ""                     # token file ("" = <workdir>/fleet.token, created 0600 per run)
    r.tls_cert = ""                       # worker: PEM certificate chain ("" = no TLS)
    r.tls_key = ""                        # worker: PEM private key of tls_cert
    r.tls_ca = ""                         # learner: PEM CA (or the self-signed tls_cert) it verifies
                                          # workers with; set = TLS channels, "" = plain ones
    r.tls_server_name = ""                # learner: name checked against worker certificates ("" = host)
    r.publish_root = ""                   # where the learner publishes weights ("" = <workdir>/publish);
                                          # workers load only uris under it
    r.max_version_jump = 100_000          # workers refuse a weights version further ahead than this
    r.max_abs_reward = 1e6                # the learner drops trajectories with |reward| above this
    r.lease_timeout_s = 1800.0            # learner: a worker holding a prompt this long is quarantined
                                          # and its prompts re-issued (half of run.batch_timeout_s)

    # --- env -----------------------------------------------------------------
    c.env = e = ml_collections.ConfigDict()
    e.tasks = ("rg/basic_arithmetic", "rg/chain_sum", "rg/gsm_symbolic", "rg/countdown")  # task specs
    e.task_config = ml_collections.ConfigDict()  # reasoning-gym generator settings, all tasks
    e.task_config.basic_arithmetic = ml_collections.ConfigDict(dict(min_terms=2, max_terms=6, min_digits=1, max_digits=4))
    e.task_size = 100_000                 # generated items per task
    e.grader = "dataset"                  # "dataset" (score_answer) | "math_verify"
    e.tool_format = "hermes"              # "tags" (byte-level) | "hermes" (chat models)
    e.prompt_style = "env"                # "env" (question + instructions) | "question" (question only, tiny models)
    e.max_tool_calls = 8                  # tool calls per episode
    e.tool_timeout_s = 10.0               # sandbox wall seconds per call
    e.tool_memory_mb = 1024               # sandbox address space per call
    e.max_observation_chars = 2000        # tool output shown to the policy
    e.harness = ""                        # "" native agent loop | "mini-swe-agent" | "reference": a harness
                                          # drives episodes through the worker's endpoint (sao/fleet/endpoint)
    e.harness_timeout_s = 1800.0          # wall seconds of one harness episode (then abandoned, reward 0)

    # Straggling tools (sao.envs.latency): per call a lognormal wall-clock sleep (no CPU) and a
    # transient failure the policy must retry; seeded by the run seed, prompt and episode.
    e.tool_latency_median_s = 0.0         # median sleep per tool call, seconds (0 = off)
    e.tool_latency_sigma = 1.5            # lognormal shape: p99 / median ~ 33x
    e.tool_latency_max_s = 30.0           # cap per call, seconds
    e.tool_failure_rate = 0.0             # probability that a call fails without running
    e.drift_schedule = ()                 # online env: learner steps where the rewarded style switches
    e.judge = "rule"                      # online env judge: "rule" | an OpenAI-compatible endpoint URL
    e.drift_recovery_fraction = 0.9       # summary: reward fraction (of the pre-switch level) that counts as adapted
    e.drift_recovery_window = 3           # summary: policy versions averaged before/after a switch

    # --- data ----------------------------------------------------------------
    c.data = d = ml_collections.ConfigDict()
    d.heldout_fraction = 0.02             # share of prompts held out for evaluation
    d.split_seed = 17                     # seed of the train / held-out hash split
    d.shuffle_seed = 0                    # prompt order seed (grain)
    d.issue_variants = 0                  # swe/ tasks: each training prompt also under k other
                                          # training hints (sao.data.swe_demos)

    # --- sft (warm start) --------------------------------------------------------
    c.sft = s = ml_collections.ConfigDict()
    s.steps = 0                           # SFT steps before RL (0 = no SFT)
    s.batch_size = 64                     # demonstrations per step
    s.lr = 1e-3                           # peak LR (warm-up then cosine)
    s.warmup_steps = 50                   # linear warm-up steps
    s.num_demos = 20_000                  # demonstrations generated
    s.tool_fraction = 0.3                 # share of demonstrations that call the tool
    s.style_mix = ""                      # final-answer styles "bare:0.7,sentence:0.15,boxed:0.15" ("" = bare)
    s.task = "basic_arithmetic"           # reasoning-gym task of the demonstrations
    s.seed = 1                            # demonstration seed (disjoint from RL prompt seeds)
    s.max_len = 128                       # padded demonstration length (tokens)
    s.issue_variants = 0                  # swe/ tasks: extra copies of each scripted fix, the issue's
                                          # hint sentence swapped for another training task's
                                          # (sao.data.swe_demos)

    # --- eval ----------------------------------------------------------------
    c.eval = v = ml_collections.ConfigDict()
    v.every = 50                          # learner steps between held-out evaluations (0 = only before/after)
    v.num_prompts = 512                   # held-out prompts per evaluation (pass@1, one sample each)
    v.temperature = 1.0                   # sampling temperature of evaluation
    v.align_actor_updates = False         # count `every` in actor updates (skip the critic warm-up)
    v.samples_per_prompt = 1              # episodes per held-out prompt (pass@1 = mean over all)
    v.value_episodes = 0                  # critics: fixed held-out episodes scored each evaluation
                                          # (eval/value_mse, eval/explained_variance; 0 = off)
    v.value_episodes_file = ""            # where they are kept ("" = <workdir>/value_heldout.bin);
                                          # arms pointing at one file share one set
    v.where = "auto"                      # "learner" (in-process JaxEngine) | "fleet" (eval leases on the
                                          # workers, never trained on) | "auto" (fleet for SGLang engines)

    # --- checkpoint ------------------------------------------------------------
    c.checkpoint = p = ml_collections.ConfigDict()
    p.every = 20                          # learner steps between orbax checkpoints
    p.keep = 3                            # checkpoints kept
    p.hf_export = True                    # also write the HF export on publish (what SGLang servers load)

    # --- run -----------------------------------------------------------------
    c.run = u = ml_collections.ConfigDict()
    u.steps = 1000                        # learner steps (paper: SAO stable for ~1000)
    u.progress = True                     # rich progress bar on the console
    u.tensorboard = True                  # also write TensorBoard events
    u.wandb_project = ""                  # also log to this Weights & Biases project ("" = off; extra [wandb])
    u.batch_timeout_s = 3600.0            # give up when no batch arrives for this long
    u.record_batches = False              # keep the batches trained on in <workdir>/replay.bin (local)
    u.replay = ""                         # train on a replay.bin instead of a fleet (sao.fleet.replay)
    return c


def cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Shrinks a config to run on this CPU: tiny byte-level model, local JAX workers, minutes."""
    c.model.preset = "tiny"
    c.model.init = ""
    c.model.param_dtype = c.model.dtype = "float32"
    c.model.tokenizer = "byte"
    c.model.mesh.update(data=1, fsdp=1, tensor=1, expert=1)
    c.learner.batch_size = 16
    c.learner.length_buckets = (128, 256)
    c.learner.micro_batch_size = 0
    c.learner.actor_lr = 3e-4             # tiny models need far larger steps than 30B ones
    c.critic.critic_lr = 1e-3
    c.critic.critic_warmup_steps = 2
    c.critic.value_pretrain_steps = 20
    c.train.value_pretrain_trajectories = 64
    c.rollout.engine = "jax"
    c.rollout.num_workers = 2
    c.rollout.max_concurrency = 16
    c.rollout.engine_slots = 16
    c.rollout.max_len = 256
    c.rollout.max_new_tokens = 48
    c.rollout.max_turns = 3
    c.env.tasks = ("rg/basic_arithmetic",)
    c.env.task_config.basic_arithmetic = ml_collections.ConfigDict(dict(
        min_terms=2, max_terms=3, min_digits=1, max_digits=2,
        operators=("+", "-", "*"), allow_negation=False))
    c.env.task_size = 4000
    c.env.tool_format = "tags"
    c.env.prompt_style = "question"
    c.env.max_tool_calls = 2
    c.env.tool_timeout_s = 5.0
    c.env.tool_memory_mb = 256
    c.env.max_observation_chars = 32
    c.data.heldout_fraction = 0.1
    c.sft.steps = 300
    c.eval.every = 10
    c.eval.num_prompts = 200
    c.checkpoint.every = 10
    c.checkpoint.hf_export = False
    c.run.steps = 30
    c.run.batch_timeout_s = 600.0
    c.rollout.lease_timeout_s = 300.0     # episodes here take seconds; a hung worker costs one wait
    return c


def fleet_cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The full-scale path shrunk to this CPU: an HF model (``model.init``, given by
    ``launch/sglang_fleet.py --model``) with its own tokenizer and Hermes tool calls,
    served by SGLang servers that the workers start (``--backend=jax`` or ``torch``
    with ``--device=cpu``), HF exports pushed and reloaded; minutes
    (tests/launch/test_cluster_runs.py and tests/rollout/test_sglang_real_server.py run it
    with a small Qwen3)."""
    c = cpu(c)
    c.model.tokenizer = "hf"
    c.learner.batch_size = 4
    c.learner.length_buckets = (384,)     # the Hermes system prompt alone is ~170 tokens
    c.critic.critic_warmup_steps = 0      # the policy moves from the first step on
    c.critic.value_pretrain_steps = 2
    c.train.value_pretrain_trajectories = 4
    c.rollout.engine = "sglang"
    c.rollout.max_concurrency = 4
    c.rollout.max_len = 384
    c.rollout.max_new_tokens = 48
    c.rollout.max_turns = 2
    c.env.tool_format = "hermes"
    c.env.prompt_style = "env"
    c.env.max_tool_calls = 1
    c.sft.steps = 0
    c.eval.every = 2
    c.eval.num_prompts = 4
    c.checkpoint.every = 2
    c.checkpoint.hf_export = True
    c.run.steps = 3
    return c


def finalize(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Derived values, consistency checks, then lock (no new fields; values may still be overridden).

    Raises ValueError on inconsistent settings.
    """
    c.learner.pad_id = config_checks.BYTE_PAD_ID if c.model.tokenizer == "byte" else c.learner.pad_id
    config_checks.check(c)   # sao.main checks again after --config.* overrides
    c.lock()
    return c


def parse_variant(arg: str | None, variants: tuple[str, ...], default: str) -> str:
    """The variant after the colon of ``--config=file.py:variant``; raises ValueError if unknown."""
    variant = arg or default
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r}; choose one of {variants}")
    return variant


# Full-scale variants shared by the math experiments: (preset, mesh, fleet size). Each mesh
# has one -1 axis that takes the devices the learner finds (sao.learner.mesh.mesh_shape), so
# it builds on what the launchers ask for: 32 chips of a v5p-64 slice (launch/tpu_vm.py), 4
# nodes x 8 GPUs (launch/gpu_slurm.py's default), or 64 devices. LAUNCH_DEVICES is what the
# launchers' defaults give; tests/multihost/test_full_scale_meshes.py builds each mesh there.
FULL_SCALE = {
    "qwen3_30b_a3b": dict(preset="qwen3-30b-a3b", mesh=dict(data=1, fsdp=-1, tensor=1, expert=4),
                          workers=16),       # 32 devices: fsdp 8 x expert 4 (128 experts, 32 each)
    "qwen3_8b": dict(preset="qwen3-8b", mesh=dict(data=1, fsdp=-1, tensor=1, expert=1), workers=8),
    "qwen3_1p7b": dict(preset="qwen3-1.7b", mesh=dict(data=-1, fsdp=4, tensor=1, expert=1), workers=4),
}
LAUNCH_DEVICES = 32    # v5p-64 = 32 chips (8 hosts x 4); Slurm default 4 nodes x 8 GPUs


def full_scale(c: ml_collections.ConfigDict, variant: str) -> ml_collections.ConfigDict:
    """Sets model / mesh / fleet size of a full-scale variant (Qwen3 on TPU/GPU, SGLang fleet)."""
    spec = FULL_SCALE[variant]
    c.model.preset = spec["preset"]
    c.model.init = f"gs://YOUR_BUCKET/models/{spec['preset']}"   # HF checkpoint dir of the base model
    c.model.mesh.update(**spec["mesh"])
    c.rollout.num_workers = spec["workers"]
    # Bit-reproducible steps cost speed at scale and, on GPU, need
    # XLA_FLAGS=--xla_gpu_deterministic_ops=true before JAX starts (the learner
    # refuses to start otherwise); full-scale runs default to fast kernels.
    c.learner.deterministic = False
    return c
