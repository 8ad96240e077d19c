"""Why the quick start's explained variance falls during RL (~0.5 after value pretraining,
~0.1 by step 30): measurements on a finished quick-start run's checkpoints.

    python -m experiments.repro.ev_study --run runs/quickstart --config experiments/quickstart.py:0 \\
        --runs /work/repro-runs [-n 256]

writes ``RUNS/_ev/ev_study.json``, which ``sweep report`` renders into RESULTS.md.
What the learner logs as ``critic/explained_variance`` (``sao.learner.update.gae_targets``)
is ``1 - Var(R - V) / Var(R)`` over the action tokens of the *new* batch of 32
trajectories, with the critic as it was *before* its K steps on that batch: an
out-of-sample prediction on 32 trajectories whose returns (γ = 1, λ_critic = 1,
one terminal reward) are one Bernoulli outcome each. Value pretraining's 0.5 is
measured on the batches it is fitting (in sample), and it stops at the first
measurement at or above the threshold. So for each checkpoint (and for the SFT
policy, with value pretraining redone as the run did it) this study samples ``n``
fresh on-policy episodes and measures:

* ``ev_pooled``: the checkpoint's critic on all ``n`` (out of sample, large sample);
* ``ev_batches``: the same per batch of 32, as logged (mean, std, min, max);
* ``reward``, ``tool_use``, ``success_tool`` / ``success_no_tool`` and
  ``ev_tool_oracle``: the EV of the best predictor that knows only whether the
  episode calls the tool (each token gets its group's mean return);
* ``refit``: a copy of the critic trained for ``refit_steps`` more steps on half of
  the episodes; EV on that half (in sample) and on the other half (out of sample).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from sao import ckpt, components
from sao.analysis import CheckpointedRun, experiment_config
from sao.learner import Learner, mesh_from_config
from sao.learner.batch import make_train_batch
from sao.learner.update import gae_targets
from sao.sft import load_params

EV_FILE = os.path.join("_ev", "ev_study.json")


def _arrays(learner, states, trajs):
    """(values, returns, mask) f32/bool[N, T] over ``trajs`` in batches of B."""
    lc, B = learner.cfg, learner.cfg.batch_size
    vs, rs, ms = [], [], []
    for i in range(0, len(trajs) - B + 1, B):
        b = make_train_batch(trajs[i:i + B], buckets=lc.length_buckets, batch_size=B,
                             pad_id=lc.pad_id)
        v = learner.critic_values(states, b.tokens)
        t = gae_targets(learner.put_batch(b), v, states.actor.step, gamma=lc.gamma, alpha=lc.alpha,
                        lam_policy=lc.lam_policy, lam_critic=lc.lam_critic, whiten=False,
                        drop_truncated=False)
        width = max(lc.length_buckets)
        pad = lambda x: np.pad(np.asarray(x), ((0, 0), (0, width - x.shape[1])))  # noqa: E731
        vs.append(pad(v))
        rs.append(pad(t["returns"]))
        ms.append(pad(t["action_mask"]).astype(bool))
    return np.concatenate(vs), np.concatenate(rs), np.concatenate(ms)


def explained_variance(values, returns, mask) -> float:
    """``1 - Var(R - V) / Var(R)`` over masked tokens (NumPy, as ``sao.algo.explained_variance``)."""
    r, e = returns[mask], (returns - values)[mask]
    return float(1.0 - e.var() / r.var()) if r.var() > 1e-8 else 0.0


def measure(learner, states, trajs) -> dict:
    """The statistics of the module doc (but ``refit``) for ``states`` on ``trajs``."""
    v, r, m = _arrays(learner, states, trajs)
    B = learner.cfg.batch_size
    per_batch = [explained_variance(v[i:i + B], r[i:i + B], m[i:i + B])
                 for i in range(0, len(v), B)]
    n = len(v)
    tool = np.array([t.metadata.get("num_tool_calls", 0) > 0 for t in trajs[:n]])
    reward = np.array([t.reward for t in trajs[:n]], np.float64)
    oracle = np.zeros_like(r)
    for g in (True, False):
        rows = tool == g
        if rows.any():
            oracle[rows] = r[rows][m[rows]].mean()
    return {"n": int(n), "reward": float(reward.mean()), "tool_use": float(tool.mean()),
            "success_tool": float(reward[tool].mean()) if tool.any() else None,
            "success_no_tool": float(reward[~tool].mean()) if (~tool).any() else None,
            "ev_pooled": explained_variance(v, r, m),
            "ev_batches": {"mean": float(np.mean(per_batch)), "std": float(np.std(per_batch)),
                           "min": float(np.min(per_batch)), "max": float(np.max(per_batch))},
            "ev_tool_oracle": explained_variance(oracle, r, m),
            "return_var_tokens": float(r[m].var())}


def refit(learner, states, trajs, steps: int) -> dict:
    """Trains the critic of ``states`` (donated) ``steps`` more steps on the first half of
    ``trajs``; EV on both halves after."""
    B = learner.cfg.batch_size
    half = (len(trajs) // (2 * B)) * B
    fit, held = trajs[:half], trajs[half:2 * half]
    batches = [make_train_batch(fit[i:i + B], buckets=learner.cfg.length_buckets, batch_size=B,
                                pad_id=learner.cfg.pad_id) for i in range(0, half, B)]
    states, res = learner.value_pretrain(states, batches, ev_threshold=np.inf, max_steps=steps)
    return {"steps": steps, "ev_in_sample": explained_variance(*_arrays(learner, states, fit)),
            "ev_held_out": explained_variance(*_arrays(learner, states, held))}, states


def study(cfg, run_dir: str, n: int, refit_steps: int = 30) -> dict:
    """Every kept checkpoint of ``run_dir`` and the SFT start (module doc)."""
    out = {"run_dir": run_dir, "n": n, "checkpoints": {}}
    with CheckpointedRun(cfg, run_dir) as run:
        # As sao.train: the SFT weights go into the policy before the learner (actor and the
        # critic it is made from) is built.
        load_params(run.policy, ckpt.latest_published(os.path.join(run_dir, "sft"))[1])
        run.learner = lrn = Learner(components.learner_config(cfg),
                                    mesh_from_config(cfg.model.mesh), run.policy)
        # Step 0: the SFT policy with the critic value-pretrained as the run did (the samples
        # are not the run's bit for bit; the procedure is).
        states = lrn.init_states()
        pre = run.sample(states, cfg.train.value_pretrain_trajectories, seed=cfg.seed)
        B = lrn.cfg.batch_size
        batches = [make_train_batch(pre[i:i + B], buckets=lrn.cfg.length_buckets, batch_size=B,
                                    pad_id=lrn.cfg.pad_id) for i in range(0, len(pre), B)]
        states, res = lrn.value_pretrain(states, batches)
        out["value_pretrain"] = {"steps": res["steps"], "history": res["history"]}
        kept = {0: states}
        for step in run.steps():
            kept[step] = run.restore(step).train_state
        for step, st in kept.items():
            trajs = run.sample(st, n, seed=1000 + step)
            m = measure(lrn, st, trajs)
            m["refit"], _ = refit(lrn, st, trajs, refit_steps)
            out["checkpoints"][str(step)] = m
            print(step, json.dumps(m), flush=True)
    from sao.run_metrics import read_metrics
    out["logged_ev"] = [[r["step"], r["critic/explained_variance"]] for r in read_metrics(run_dir)
                        if r.get("phase") == "rl" and "critic/explained_variance" in r]
    return out


def load(runs: str) -> dict | None:
    """The recorded study of ``runs`` (None if it has not been run)."""
    path = os.path.join(runs, EV_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def markdown(res: dict | None) -> str:
    """The study's table (RESULTS.md); says so when it has not been run."""
    if res is None:
        return "Not measured yet: `python -m experiments.repro.ev_study` has not been run here."
    logged = res.get("logged_ev", [])

    def window(lo, hi):
        vals = [v for s, v in logged if lo <= s <= hi]
        return f"{np.mean(vals):.2f} (sd {np.std(vals):.2f})" if vals else "—"

    cmd = (f"python -m experiments.repro.ev_study --run {res['run_dir']} --config "
           f"{res.get('config', 'experiments/quickstart.py:0')} --runs RUNS -n {res['n']}")
    lines = [f"`{cmd}` (the source run is a `make run` quick-start run, seed 0, "
             f"30 steps, its checkpoints at steps 10, 20, 30 and its SFT weights). Logged "
             f"`critic/explained_variance`: steps 1-10 mean {window(1, 10)}, 11-20 "
             f"{window(11, 20)}, 21-30 {window(21, 30)}. Value pretraining redone on the SFT "
             f"policy: {res['value_pretrain']['steps']} critic steps, in-sample EV history "
             f"{', '.join(f'{x:.2f}' for x in res['value_pretrain']['history'])}.",
             "", f"Each row: {res['n']} fresh on-policy episodes of that checkpoint's policy.", "",
             "| step | reward | tool use | success with / without tool | EV pooled | EV per batch of 32 (mean ± sd, min..max) | EV of a tool-use-only predictor | refit 30 steps: EV in sample / held out |",
             "|---|---|---|---|---|---|---|---|"]
    for step, m in sorted(res["checkpoints"].items(), key=lambda kv: int(kv[0])):
        b = m["ev_batches"]
        fmt = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {step} | {m['reward']:.2f} | {m['tool_use']:.2f} | "
                     f"{fmt(m['success_tool'])} / {fmt(m['success_no_tool'])} | "
                     f"{m['ev_pooled']:.2f} | {b['mean']:.2f} ± {b['std']:.2f} "
                     f"({b['min']:.2f}..{b['max']:.2f}) | {m['ev_tool_oracle']:.2f} | "
                     f"{m['refit']['ev_in_sample']:.2f} / {m['refit']['ev_held_out']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="a finished quick-start run directory")
    p.add_argument("--config", default="experiments/quickstart.py:0")
    p.add_argument("--runs", required=True, help="sweep runs directory (the result goes to _ev/)")
    p.add_argument("-n", type=int, default=256)
    args = p.parse_args(argv)
    res = study(experiment_config(args.config), os.path.abspath(args.run), args.n)
    res["config"] = args.config
    path = os.path.join(args.runs, EV_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    print(markdown(res))


if __name__ == "__main__":
    main()


def plot(ev: dict | None, out_dir: str) -> str | None:
    """docs/repro_ev_study.png: the EV study's measures by checkpoint step (None: no study)."""
    if ev is None:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = sorted(int(k) for k in ev["checkpoints"])
    rows = [ev["checkpoints"][str(k)] for k in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, vals in (("critic EV, fresh episodes", [m["ev_pooled"] for m in rows]),
                        ("tool-use-only predictor EV", [m["ev_tool_oracle"] for m in rows]),
                        ("critic refit 30 steps, held-out EV", [m["refit"]["ev_held_out"] for m in rows]),
                        ("tool use", [m["tool_use"] for m in rows])):
        ax.plot(steps, vals, marker="o", label=label)
    if ev.get("logged_ev"):
        ax.plot(*zip(*ev["logged_ev"]), color="grey", alpha=0.5, label="logged EV (per batch)")
    ax.set_xlabel("quick-start learner step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "repro_ev_study.png"), dpi=90)
    plt.close(fig)
    return "repro_ev_study.png"
