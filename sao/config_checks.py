"""Consistency checks of a run's resolved config, after every ``--config.*`` override.

An experiment file's ``get_config`` checks its own values (``experiments.common.finalize``
calls `check`), but ``--config.learner.length_buckets=...`` and the like are applied by
ml_collections *after* ``get_config`` returns. `sao.main` therefore calls `check` again
on the config it is handed, before any worker starts or any file is written, so a bad
override fails at once with a reason instead of as a worker that "did not start" or a
shape error minutes into the run.
"""
from __future__ import annotations

import os

from sao import storage
from sao.models.config import PRESETS

BYTE_PAD_ID = 256   # the byte tokenizer's pad id (sao.models.tokenizer.ByteTokenizer)
# Policy losses whose importance ratio uses the engine's log-probs (as behaviour policy or
# as TIS / MIS weights): sao.learner.steps.ROLLOUT_BEHAVIOUR_LOSSES + ROLLOUT_KWARG_LOSSES
# (tests/test_config_checks.py keeps the two in step; importing them here would load JAX).
ROLLOUT_RATIO_LOSSES = ("sao_dis", "ppo_clip", "grpo_tis", "grpo_mis")


def problems(cfg, *, local_paths: bool = True) -> list[str]:
    """Every inconsistency of ``cfg`` (an experiment ConfigDict), as readable sentences.

    Checked: the largest ``learner.length_buckets`` holds ``rollout.max_len`` tokens;
    GRPO (``learner.advantage_estimator="grpo"``) has ``rollout.group_size >= 2``; the
    byte tokenizer pads with id 256; a harness (``env.harness``) evaluates on the fleet;
    an SGLang engine (its log-probs are those of the
    untruncated distribution) samples without top-p / top-k when the policy loss takes
    an importance ratio against the engine's log-probs (``ROLLOUT_RATIO_LOSSES``);
    swe/ tasks keep their tool instructions (``env.prompt_style="env"``), and a harness
    with the question-only prompt uses the ``"tags"`` format;
    ``model.preset`` is known when no ``model.init`` is
    given; with ``local_paths`` a local ``model.init`` exists on this machine (the
    launchers check configs for other machines and pass False).
    """
    out = []
    buckets = tuple(cfg.learner.length_buckets)
    if not buckets or max(buckets) < cfg.rollout.max_len:
        out.append(f"largest learner.length_buckets {max(buckets, default=0)} < rollout.max_len "
                   f"{cfg.rollout.max_len}: episodes of rollout.max_len tokens would not fit")
    if cfg.learner.advantage_estimator == "grpo" and cfg.rollout.group_size < 2:
        out.append(f"GRPO needs rollout.group_size >= 2 (got {cfg.rollout.group_size})")
    if cfg.model.tokenizer == "byte" and cfg.learner.pad_id != BYTE_PAD_ID:
        out.append(f"model.tokenizer='byte' pads with id {BYTE_PAD_ID}; learner.pad_id is "
                   f"{cfg.learner.pad_id}")
    r = cfg.rollout
    if (r.engine == "sglang" and (r.top_p < 1.0 or r.top_k > 0)
            and cfg.learner.policy_loss in ROLLOUT_RATIO_LOSSES):
        out.append(f"rollout.engine='sglang' reports log-probs of the untruncated distribution, "
                   f"but rollout.top_p={r.top_p} / top_k={r.top_k} truncate what it samples: "
                   f"learner.policy_loss={cfg.learner.policy_loss!r} takes its importance ratio "
                   "against those log-probs, which would be biased; set rollout.top_p=1.0 and "
                   "rollout.top_k=0, or use rollout.engine='jax' (it reports the log-probs of "
                   "the truncated distribution)")
    if not cfg.model.init and cfg.model.preset not in PRESETS:
        out.append(f"unknown model.preset {cfg.model.preset!r}; known: {', '.join(PRESETS)}")
    if cfg.env.get("harness") and cfg.eval.where != "fleet":
        out.append(f"env.harness={cfg.env.harness!r} drives episodes through the workers' endpoints: "
                   f"held-out evaluation must run there too (eval.where='fleet', got "
                   f"{cfg.eval.where!r})")
    swe = [t for t in cfg.env.tasks if t.startswith("swe/")]
    question = cfg.env.get("prompt_style", "env") == "question"
    if swe and question:
        out.append(f"env.prompt_style='question' shows {swe[0]} episodes the issue without the "
                   "tool instructions, but the scripted demonstrations and the harnesses show them: "
                   "set env.prompt_style='env'")
    elif question and cfg.env.get("harness") and cfg.env.tool_format != "tags":
        out.append(f"env.prompt_style='question' with env.harness={cfg.env.harness!r} and "
                   f"env.tool_format={cfg.env.tool_format!r}: the endpoint lists the tools in a "
                   "system turn the native loop's prompt does not have; use 'tags' or "
                   "env.prompt_style='env'")
    init = cfg.model.init
    if local_paths and init and not storage.is_remote(init) and not os.path.exists(init):
        out.append(f"model.init {init}: no such file or directory")
    return out


def check(cfg, *, local_paths: bool = True) -> None:
    """Raises ValueError listing every problem `problems` finds (the config's name first)."""
    found = problems(cfg, local_paths=local_paths)
    if found:
        raise ValueError(f"{cfg.name}: " + "; ".join(found))
