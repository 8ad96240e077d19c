"""Host-side running-mean baseline (docs/algorithm.md §7): ``A = R - mean(last W rewards)``.

Single rollout per prompt, no critic. Per-prompt scope (``W = 8``): each
prompt id gets its own ring buffer (slot), shared by the prompt's rollouts in
every epoch; slots grow as new prompts appear.
Global scope (the online setting, ``W = 128``): one slot for every
trajectory. A batch never baselines against its own rewards: the kernel
(`sao.algo.running_mean_advantages`) reads the buffers first, then pushes the
batch in. The state is plain numpy / JSON (`state_dict`), saved with the
run's checkpoint (``data_state["baseline"]``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from sao.algo import RunningMeanState, running_mean_advantages

SCOPES = ("prompt", "global")


class RunningMeanBaseline:
    """Running-mean baseline keyed by prompt id (or one global slot).

    Args:
      window: rewards kept per slot (W).
      scope: ``"prompt"`` (one slot per prompt) or ``"global"`` (one slot).
      default_baseline: baseline of a slot without history.
    """

    def __init__(self, window: int, scope: str = "prompt", default_baseline: float = 0.0):
        if scope not in SCOPES:
            raise ValueError(f"running-mean scope must be one of {SCOPES}, got {scope!r}")
        if window < 1:
            raise ValueError(f"running-mean window must be >= 1, got {window}")
        self.window, self.scope, self.default_baseline = int(window), scope, float(default_baseline)
        self.slots: dict[str, int] = {}
        self.rewards = np.zeros((0, self.window), np.float32)
        self.count = np.zeros((0,), np.int32)

    def _slot(self, prompt_id: str) -> int:
        key = "" if self.scope == "global" else prompt_id
        if key not in self.slots:
            self.slots[key] = len(self.slots)
        return self.slots[key]

    def advantages(self, prompt_ids: Sequence[str], rewards, batch_size: int | None = None) -> np.ndarray:
        """Per-row advantages f32[batch_size] (padding rows 0); updates the buffers.

        ``prompt_ids``: the rows' prompt ids (``Trajectory.prompt_id``, the same in
        every epoch); ``rewards``: f32[n]. Raises ValueError if their lengths differ.
        """
        rewards = np.asarray(rewards, np.float32)
        n = len(prompt_ids)
        if rewards.shape != (n,):
            raise ValueError(f"rewards must be f32[{n}], got {rewards.shape}")
        slots = np.array([self._slot(p) for p in prompt_ids], np.int32)
        grow = len(self.slots) - self.count.shape[0]
        if grow > 0:
            self.rewards = np.concatenate([self.rewards, np.zeros((grow, self.window), np.float32)])
            self.count = np.concatenate([self.count, np.zeros((grow,), np.int32)])
        out = np.zeros((batch_size or n,), np.float32)
        if n:
            state = RunningMeanState(self.rewards, self.count)
            adv, state = running_mean_advantages(rewards, slots, state,
                                                 default_baseline=self.default_baseline)
            out[:n] = np.asarray(adv)
            self.rewards, self.count = np.array(state.rewards), np.array(state.count)
        return out

    def __call__(self, trajectories, batch_size: int | None = None) -> np.ndarray:
        """`advantages` of ``sao.types.Trajectory`` rows, in batch order."""
        return self.advantages([t.prompt_id for t in trajectories],
                               [t.reward for t in trajectories], batch_size)

    def state_dict(self) -> dict:
        """JSON-serialisable state."""
        return {"window": self.window, "scope": self.scope, "slots": dict(self.slots),
                "rewards": self.rewards.tolist(), "count": self.count.tolist()}

    def load_state_dict(self, state: dict) -> None:
        if state["window"] != self.window or state["scope"] != self.scope:
            raise ValueError(f"baseline state has window {state['window']} / scope {state['scope']!r}, "
                             f"this baseline {self.window} / {self.scope!r}")
        self.slots = {k: int(v) for k, v in state["slots"].items()}
        self.rewards = np.asarray(state["rewards"], np.float32).reshape(-1, self.window)
        self.count = np.asarray(state["count"], np.int32).reshape(-1)
