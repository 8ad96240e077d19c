"""Where a run's wall time goes: named parts timed with ``time.perf_counter``.

The learner process (``sao.train``) times its phases and the RL loop
(``sao.rl_loop``) the parts of each step; :func:`breakdown` turns them into
the ``time/...`` keys of ``summary.json`` and :func:`table` into the table
printed at the end of a run::

    time/sft_s, time/eval_before_s, time/value_pretrain_s, time/rl_s, time/eval_after_s,
    time/setup_s            (phases of the learner process; they sum to wall_s)
    time/rl/update_s        learner compute (critic + actor steps, metrics fetched to the host)
    time/rl/wait_fleet_s    waiting for a batch of trajectories from the fleet
    time/rl/publish_s       writing the new weights and pushing them to the workers
    time/rl/eval_s, time/rl/checkpoint_s, time/rl/batch_s (padding, batch metrics),
    time/rl/log_s (metric records, progress), time/rl/other_s (the rest of time/rl_s)
    time/eval_s             every held-out evaluation (before, during and after RL)
    time/<part>_frac        the part's share of wall_s
    time/<part>_cpu_s       CPU seconds of the learner process (all its threads) in the part

plus ``time/startup_s`` (process start to the first phase: imports, starting
the rollout workers) and the CPU seconds of the learner process and of its
child processes (the local workers). On a shared, loaded machine wall times
follow the load; CPU seconds compare runs (the ``_cpu_s`` keys and the
table's CPU column).

A part's timer stops when its host code returns: parts that run device work
must end with a host transfer of their outputs (``Learner.update`` fetches its
metrics; publishing reads the parameters), or the time lands in a later part.
The standard library's clock suffices here (a timing package such as
``codetiming`` keeps its totals in one process-wide dict).
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterator, Mapping

import psutil  # a dependency of orbax-checkpoint
from rich.table import Table

PHASES = ("setup", "sft", "eval_before", "value_pretrain", "rl", "eval_after")
RL_PARTS = ("update", "wait_fleet", "publish", "eval", "checkpoint", "batch", "log")


class Stopwatch:
    """Total wall seconds and process CPU seconds per named part.

    ``with watch.part("update"): ...`` adds the block's wall duration
    (``time.perf_counter``) and this process's CPU time over it
    (``time.process_time``: every thread), also when it raises;
    ``add(name, seconds, cpu_seconds)`` adds measured durations (ValueError if
    negative). ``totals`` / ``cpu`` map part → seconds, in first-seen order.
    """

    def __init__(self):
        self.totals: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start, max(0.0, time.process_time() - cpu))

    def add(self, name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
        if seconds < 0 or cpu_seconds < 0:
            raise ValueError(f"negative duration {seconds} / {cpu_seconds} for {name!r}")
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu_seconds

    def merge(self, other: "Stopwatch") -> None:
        """Adds ``other``'s totals to this one's."""
        for name, seconds in other.totals.items():
            self.add(name, seconds, other.cpu.get(name, 0.0))

    def get(self, name: str) -> float:
        """Wall seconds of ``name`` (0.0 if never timed)."""
        return self.totals.get(name, 0.0)

    def get_cpu(self, name: str) -> float:
        """CPU seconds of ``name`` (0.0 if never timed)."""
        return self.cpu.get(name, 0.0)


def startup_s() -> float:
    """Seconds since this process started (imports, spawning workers, ... before the first phase)."""
    return max(0.0, time.time() - psutil.Process().create_time())


def cpu_s() -> tuple[float, float]:
    """``(this process's CPU seconds, its live child processes' CPU seconds)``, user + system."""
    me = psutil.Process()
    own = sum(me.cpu_times()[:2])
    children = 0.0
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):          # a child may exit meanwhile
            children += sum(child.cpu_times()[:2])
    return own, children


def breakdown(phases: Stopwatch, rl: Stopwatch, *, wall_s: float,
              cpu_s: float | None = None) -> dict[str, float]:
    """The ``time/...`` summary keys (module doc) of a learner process that ran ``wall_s`` seconds
    using ``cpu_s`` CPU seconds (None: no ``_cpu_s`` keys).

    ``phases`` holds :data:`PHASES` (``setup`` is filled in as the rest of
    ``wall_s`` / ``cpu_s``), ``rl`` the RL loop's :data:`RL_PARTS`. Seconds and
    fractions rounded to 0.1 s / 0.001. Raises ValueError if ``wall_s`` <= 0 or
    the timed phases exceed it by more than 1%.
    """
    if wall_s <= 0:
        raise ValueError(f"wall_s must be > 0, got {wall_s}")
    timed = sum(phases.get(p) for p in PHASES if p != "setup")
    if timed > wall_s * 1.01:
        raise ValueError(f"timed phases ({timed:.1f} s) exceed the wall time ({wall_s:.1f} s)")
    out: dict[str, float] = {}
    for suffix, get, total in (("_s", "get", wall_s), ("_cpu_s", "get_cpu", cpu_s)):
        if total is None:
            continue
        ph, lo = getattr(phases, get), getattr(rl, get)
        seconds = {p: ph(p) for p in PHASES if p != "setup"}
        seconds["setup"] = max(0.0, total - sum(seconds.values()))
        for p in ("value_pretrain/sample", "value_pretrain/fit"):
            seconds[p] = ph(p)
        for p in RL_PARTS:
            seconds[f"rl/{p}"] = lo(p)
        seconds["rl/other"] = max(0.0, ph("rl") - sum(lo(p) for p in RL_PARTS))
        seconds["eval"] = ph("eval_before") + lo("eval") + ph("eval_after")
        out.update({f"time/{k}{suffix}": round(v, 1) for k, v in seconds.items()})
        if suffix == "_s":
            out.update({f"time/{k}_frac": round(v / wall_s, 3) for k, v in seconds.items()})
    return out


_ROWS = (("setup", "setup (model, learner, engine, summary)"), ("sft", "SFT warm start"),
         ("eval_before", "evaluation before RL"), ("value_pretrain", "value pretraining"),
         ("value_pretrain/sample", "  sampling trajectories"), ("value_pretrain/fit", "  critic steps"),
         ("rl", "RL"), ("rl/update", "  learner compute (update)"),
         ("rl/wait_fleet", "  waiting for the fleet"), ("rl/publish", "  publish + push weights"),
         ("rl/eval", "  evaluations during RL"), ("rl/checkpoint", "  checkpoints"),
         ("rl/batch", "  batch padding, batch metrics"), ("rl/log", "  metric records, progress"),
         ("rl/other", "  other"), ("eval_after", "evaluation after RL"),
         ("eval", "all evaluations (included above)"))


def table(summary: Mapping[str, float]) -> Table:
    """A rich Table of the ``time/...`` keys of ``summary`` (seconds and share of ``wall_s``)."""
    t = Table(title=f"Where the {summary.get('wall_s', 0):.0f} s went (learner process)")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    t.add_column("CPU s", justify="right")
    for key, label in _ROWS:
        if f"time/{key}_s" in summary:
            cpu = summary.get(f"time/{key}_cpu_s")
            t.add_row(label, f"{summary[f'time/{key}_s']:.1f}",
                      f"{100 * summary[f'time/{key}_frac']:.1f}%", "" if cpu is None else f"{cpu:.1f}")
    if "time/startup_s" in summary:
        t.add_row("before the first phase (imports, workers start)", f"{summary['time/startup_s']:.1f}",
                  "", "")
    for key, label in (("time/learner_cpu_s", "CPU only: learner process, from its start"),
                       ("time/workers_cpu_s", "CPU only: rollout workers, from their start")):
        if key in summary:
            t.add_row(label, "", "", f"{summary[key]:.1f}")
    return t
