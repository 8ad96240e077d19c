"""The run's metric records: JSONL + TensorBoard writer, reader, summary file, progress line and table.

(The dispatcher's fleet counters are ``sao.fleet.metrics``; they reach these
records as ``fleet/...`` keys.)

Every learner step writes one JSON object to ``<workdir>/metrics.jsonl``::

    {"step": 12, "time_s": 31.4, "actor/loss": ..., "eval/accuracy": ...}

Keys are namespaced ``<subsystem>/<name>`` (``actor/``, ``critic/``,
``batch/``, ``fleet/``, ``parity/`` (per rollout server: ``parity/<host:port>/mean_gap``
...; ``sao.fleet.parity``), ``eval/``, ``sft/``, ``value_pretrain/``). Scalars
also go to TensorBoard (tensorboardX) under ``<workdir>/tb``. Lists (e.g.
``batch/staleness_counts``: number of action tokens per staleness 0, 1, ...)
are kept in the JSONL only. With ``wandb_project`` (config ``run.wandb_project``;
the ``wandb`` extra, off by default) the same scalars, under the same names as
in TensorBoard, also go to Weights & Biases (``WANDB_MODE=offline`` keeps the
run in ``<workdir>/wandb`` for a later ``wandb sync``). A resumed run appends; readers merge the
records of one (phase, step), later values winning.

The work dir may be local or ``gs://`` (``sao.storage``: the JSONL and the
event files are rewritten whole on each flush there, as objects cannot be
appended to). Nothing here touches devices: values are converted with
``float()`` (call ``jax.device_get`` first for device arrays).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any, Iterable, Mapping

import ml_collections
import numpy as np
from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

from sao import storage

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def _to_json_value(value: Any) -> Any:
    """Converts numpy / jax scalars and arrays into JSON-able Python values."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None if math.isnan(v) else v
    arr = np.asarray(value)
    if arr.ndim == 0:
        return _to_json_value(arr.item())
    return [_to_json_value(v) for v in arr.tolist()]


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)) or hasattr(value, "__array__"):
        return _to_json_value(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MetricsWriter:
    """Appends per-step metrics to ``metrics.jsonl`` and TensorBoard.

    Args:
      workdir: run directory (created if missing), local or ``gs://``.
      tensorboard: also write TensorBoard event files under ``workdir/tb``.

    Raises ``sao.storage.StorageError`` for a ``gs://`` work dir without gcsfs
    or credentials.

    ``write(step, metrics)`` raises ValueError if ``step`` is negative or a key
    is not namespaced (``"a/b"``); non-finite floats are written as ``null``
    (NaN) or ``Infinity`` so that a bad step stays visible.
    """

    def __init__(self, workdir: str, *, tensorboard: bool = True, wandb_project: str = "",
                 run_name: str = "", run_config: Mapping[str, Any] | None = None):
        storage.check(workdir, "work dir")
        storage.makedirs(workdir)
        self.path = storage.join(workdir, METRICS_FILE)
        self._file = storage.AppendLog(self.path)
        self._tb = None
        if tensorboard:
            self._tb = storage.tensorboard_writer(storage.join(workdir, "tb"))
        self._wandb = _wandb_run(workdir, wandb_project, run_name, run_config) if wandb_project else None
        self._t0 = time.monotonic()

    def write(self, step: int, metrics: Mapping[str, Any], *, phase: str = "rl") -> dict:
        """Writes one record; returns it (JSON-able dict)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        record: dict[str, Any] = {"step": int(step), "phase": phase,
                                  "time_s": round(time.monotonic() - self._t0, 3)}
        for key, value in metrics.items():
            if "/" not in key:
                raise ValueError(f"metric key {key!r} must be namespaced as 'subsystem/name'")
            record[key] = _to_json_value(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars = {f"{phase}/{key}" if phase != "rl" else key: value for key, value in record.items()
                   if "/" in key and _is_scalar(value)}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({**scalars, f"{phase}/step" if phase != "rl" else "step": int(step)})
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _wandb_run(workdir: str, project: str, name: str, config: Mapping[str, Any] | None):
    """A W&B run for this work dir (one id per work dir: a resumed run continues it); its local
    files go under ``<workdir>/wandb`` (a temporary directory for ``gs://``). Raises
    ImportError naming the extra when wandb is not installed."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError("run.wandb_project is set but wandb is not installed: "
                          "pip install -e '.[wandb]'") from e
    local = "://" not in workdir
    run_id = "sao-" + hashlib.sha256(str(workdir).encode()).hexdigest()[:12]
    return wandb.init(project=project, name=name or None, id=run_id, resume="allow",
                      dir=workdir if local else None, config=dict(config or {}))


class NullWriter:
    """`MetricsWriter`'s interface that keeps nothing: processes 1.. of a
    multi-host learner (process 0 writes the run's records)."""

    def write(self, step: int, metrics: Mapping[str, Any], *, phase: str = "rl") -> dict:
        return {"step": int(step), "phase": phase, **metrics}

    def close(self) -> None:
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def read_metrics(workdir: str) -> list[dict]:
    """Reads ``metrics.jsonl`` of a run: one dict per (phase, step), records merged, later keys win.

    Raises FileNotFoundError if the run has no metrics file. A truncated last
    line (a run killed mid-write) is ignored.
    """
    path = storage.join(workdir, METRICS_FILE)
    records: dict[tuple[str, int], dict] = {}
    if not storage.exists(path):
        raise FileNotFoundError(f"no {METRICS_FILE} in {workdir}")
    for line in storage.read_text(path).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.setdefault((rec.get("phase", "rl"), int(rec["step"])), {}).update(rec)
    return [records[k] for k in sorted(records, key=lambda k: (k[0] != "rl", k[0], k[1]))]


def load_run(workdir: str, phase: str = "rl"):
    """Metrics of one phase as a pandas DataFrame indexed by step (for notebooks; pandas is
    the ``notebooks`` extra, imported here only).

    Columns are the namespaced keys; list-valued metrics stay as Python lists.
    """
    import pandas as pd
    rows = [r for r in read_metrics(workdir) if r.get("phase", "rl") == phase]
    return pd.DataFrame(rows).set_index("step").sort_index() if rows else pd.DataFrame()


def staleness_histogram(workdir: str) -> np.ndarray:
    """Sums ``batch/staleness_counts`` over all RL steps: i64[S] token counts per lag."""
    total = np.zeros(0, dtype=np.int64)
    for rec in read_metrics(workdir):
        counts = rec.get("batch/staleness_counts")
        if rec.get("phase", "rl") != "rl" or not counts:
            continue
        counts = np.asarray(counts, dtype=np.int64)
        if counts.size > total.size:
            total = np.pad(total, (0, counts.size - total.size))
        total[: counts.size] += counts
    return total


def budget(workdir: str, *, batch_size: int, steps: int, policy_version: int,
           fleet: Mapping[str, Any]) -> dict[str, int]:
    """What a run spent, in trajectories, cumulative over resumes (``summary.json``'s
    ``budget``; docs/learner.md, "Budget").

    ``actor_updates`` (= the policy version), ``actor_trajectories`` (rows of the steps
    that updated the actor), ``critic_only_trajectories`` (rows of critic warm-up steps),
    ``trained`` (all rows of the ``steps`` learner steps of ``batch_size``),
    ``pretraining`` (value-pretraining samples, from the run's ``value_pretrain`` record),
    ``dropped`` (``fleet["dropped"]``, the dispatcher's, plus ``dropped_groups_rows``:
    GRPO rows dropped with their group, from the last RL record's ``groups/...``) and
    ``generated`` (every trajectory sampled for training that came back: trained +
    dropped + pretraining).
    """
    rows, actor = steps * batch_size, int(policy_version) * batch_size
    pre, groups = 0, {}
    if storage.exists(storage.join(workdir, METRICS_FILE)):
        for r in read_metrics(workdir):
            if r.get("phase") == "value_pretrain" and "value_pretrain/trajectories" in r:
                pre = int(r["value_pretrain/trajectories"])
            if r.get("phase", "rl") == "rl" and "groups/dropped_rows" in r:
                groups = r
    group_rows = int(groups.get("groups/dropped_rows", 0)) + int(groups.get("groups/late_rows", 0))
    dropped = int(fleet.get("dropped", 0)) + group_rows
    return {"actor_updates": int(policy_version), "actor_trajectories": actor,
            "critic_only_trajectories": rows - actor, "trained": rows, "pretraining": pre,
            "dropped": dropped, "dropped_groups_rows": group_rows,
            "generated": rows + dropped + pre}


def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` as JSON to ``path`` (local or ``gs://``) atomically
    (``sao.storage.write_text``).

    numpy / jax scalars and arrays become Python values; raises TypeError on
    anything else JSON cannot hold.
    """
    storage.write_text(path, json.dumps(obj, indent=2, default=_json_default))


def config_from_dict(d: Mapping[str, Any]):
    """The locked ``ConfigDict`` of a run's ``config.json`` (``CONFIG_FILE``: the
    resolved experiment config, ``cfg.to_dict()``, written by ``sao.train``). JSON
    lists come back as tuples, as experiment files write sequences."""
    cfg = ml_collections.ConfigDict(_tuples(dict(d)))
    cfg.lock()
    return cfg


def _tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def summary_table(summary: Mapping[str, Any]):
    """A rich Table of the run summary (accuracy / tool use before and after, counts, time)."""
    def pct(key):
        v = summary.get(key)
        return "-" if v is None else f"{100 * v:.1f}%"

    table = Table(title="SAO run summary")
    table.add_column("metric")
    table.add_column("before RL", justify="right")
    table.add_column("after RL", justify="right")
    table.add_row("held-out accuracy (pass@1)", pct("accuracy_before"), pct("accuracy_after"))
    table.add_row("tool-use rate", pct("tool_use_before"), pct("tool_use_after"))
    for key, label in (("steps", "learner steps"), ("trajectories", "trajectories trained on"),
                       ("dropped", "trajectories dropped"), ("eval_prompts", "held-out prompts"),
                       ("wall_s", "wall time (s)")):
        if key in summary:
            v = summary[key]
            table.add_row(label, "", f"{v:.1f}" if isinstance(v, float) else str(v))
    return table


class Progress:
    """A one-line rich progress bar for a loop of ``total`` steps.

    ``update(step, metrics)`` shows the chosen keys; ``log(text)`` prints above
    the bar. Disabled (prints nothing) when ``enabled`` is False.
    """

    def __init__(self, total: int, *, description: str = "train",
                 keys: Iterable[str] = (), enabled: bool = True):
        self._keys = tuple(keys)
        self._enabled = enabled
        self._bar = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[info]}"), disable=not enabled)
        self._task = self._bar.add_task(description, total=total, info="")

    def __enter__(self):
        self._bar.start()
        return self

    def __exit__(self, *exc):
        self._bar.stop()

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        info = ""
        if metrics:
            parts = []
            for k in self._keys:
                v = metrics.get(k)
                if _is_scalar(v) or isinstance(v, (np.floating, np.integer)):
                    parts.append(f"{k.split('/')[-1]}={float(v):.3g}")
            info = " ".join(parts)
        self._bar.update(self._task, completed=step, info=info)

    def log(self, text: str) -> None:
        if self._enabled:
            self._bar.console.print(text)


def run_summary(workdir: str, *, before: dict, after: dict, fleet: dict, eval_prompts: int,
                steps: int, samples_per_prompt: int, batch_size: int, policy_version: int) -> dict:
    """The core of a finished run's ``summary.json``: held-out accuracy and tool use before and
    after RL (``before`` / ``after``: evaluation records), the fleet's counts (``fleet``: the
    dispatcher's snapshot: ``trained``, ``dropped``, ``drops`` by reason, ``quarantined``),
    updates voided by a non-finite gradient over every resume (from ``workdir``'s records)
    and the run's ``budget``."""
    return {"accuracy_before": before["eval/accuracy"], "accuracy_after": after["eval/accuracy"],
            "tool_use_before": before["eval/tool_use"], "tool_use_after": after["eval/tool_use"],
            "steps": steps, "trajectories": fleet["trained"], "dropped": fleet["dropped"],
            "drops": dict(fleet.get("drops", {})),               # by reason
            "quarantined": fleet.get("quarantined", 0),
            "learner_nonfinite_skips": int(sum(                  # updates voided, all resumes
                r.get("learner/nonfinite_skips", 0) for r in read_metrics(workdir)
                if r.get("phase", "rl") == "rl")),
            "eval_prompts": eval_prompts, "eval_samples_per_prompt": samples_per_prompt,
            "policy_version": policy_version,
            "budget": budget(workdir, batch_size=batch_size, steps=steps,
                             policy_version=policy_version, fleet=fleet)}
