"""Human-readable view of a trajectory: spans of equal (action_mask, version)."""
from __future__ import annotations

from sao.types import Trajectory


def format_trajectory(traj: Trajectory, tokenizer, *, max_text: int = 60) -> str:
    """One line per span of consecutive tokens sharing ``action_mask`` and
    ``policy_version``: token range, kind, mask, version, summed rollout
    log-prob and the decoded text (shortened to ``max_text`` characters)."""
    lines = [f"{'tokens':>9}  {'kind':<6} mask  ver  {'sum logp':>8}  text"]
    n, start = traj.length, 0
    for t in range(1, n + 1):
        if t < n and (traj.action_mask[t] == traj.action_mask[start]
                      and traj.policy_version[t] == traj.policy_version[start]):
            continue
        action = bool(traj.action_mask[start])
        kind = "action" if action else ("prompt" if start == 0 else "obs")
        text = tokenizer.decode(traj.tokens[start:t].tolist())
        text = repr(text if len(text) <= max_text else text[:max_text - 3] + "...")
        lp = float(traj.rollout_logprobs[start:t].sum())
        lines.append(f"{start:>4}-{t - 1:<4}  {kind:<6} {int(action):>4}  "
                     f"{int(traj.policy_version[start]):>3}  {lp:>8.3f}  {text}")
        start = t
    lines.append(f"finish={traj.finish} reward={traj.reward:g} "
                 f"action_tokens={traj.num_action_tokens}/{n}")
    return "\n".join(lines)
