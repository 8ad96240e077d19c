"""Issue 22: the pre-registered rule, the claims as code, the clean-commit records that let a
sweep continue on a new machine, the evaluation-noise sentence and sweep status's ETA."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.repro import (ARM_NAMES, ARMS, base, claims, mech, progress,  # noqa: E402
                               records as rec, results, sweep, verdicts)


def test_verdict_rule_and_minimum_detectable_effect():
    up = results.verdict([0.02, 0.03, 0.04, 0.05], +1)
    assert up["verdict"] == "supported" and up["low"] > 0 and up["n"] == 4
    assert results.verdict([0.02, 0.03, 0.04, 0.05], -1)["verdict"] == "contradicted"
    wide = results.verdict([0.10, -0.05, 0.08, -0.02], +1)
    assert wide["verdict"] == "inconclusive at this n" and wide["low"] < 0 < wide["high"]
    # MDE by hand: n = 8, sd = 1: (t_.975,7 + t_.8,7) / sqrt(8) = (2.3646 + 0.8960) / 2.8284
    assert results.mde(1.0, 8) == pytest.approx(1.1528, abs=1e-3)
    assert wide["mde"] == pytest.approx(results.mde(np.std([0.10, -0.05, 0.08, -0.02], ddof=1), 4))
    assert results.verdict([0.1], +1)["verdict"] == "not measured"
    none = results.verdict([0.0, 0.0, 0.0], +1)        # nothing collapsed anywhere
    assert none["verdict"] == "inconclusive at this n" and none["mde"] is None
    with pytest.raises(ValueError):
        results.verdict([1.0, 2.0], 0)
    with pytest.raises(ValueError):
        results.mde(1.0, 8, power=1.0)


def test_claims_match_the_preregistration_and_name_real_arms():
    text = open(os.path.join(ROOT, "experiments", "repro", "PREREGISTRATION.md")).read()
    for c in claims.CLAIMS:
        assert {c.arm, c.ref} <= set(ARM_NAMES) and c.endpoint in claims.ENDPOINTS
        assert f"| {c.id} |" in text and f"`{c.arm}` − `{c.ref}`" in text, c.id
    groups = {a: g for a, g, _ in ARMS}
    for arm in ("m_sao", "m_grpo", "m_grpo_dis", "m_vapo"):
        assert len(base.seeds_of(groups[arm])) >= 8
    assert base.EVAL_SAMPLES >= 4


def test_the_sweep_fits_its_budget_at_the_priors():
    assert progress.planned_hours(list(ARM_NAMES), None) <= base.MAX_SWEEP_HOURS


def test_the_discussion_writes_no_verdict_by_hand():
    text = open(os.path.join(ROOT, "experiments", "repro", "discussion.md")).read().lower()
    for word in ("not reproduced", "reproduced", "confirmed", "supported", "contradicted",
                 "refuted"):
        assert word not in text, word


def _git_repo(path):
    def git(*args):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "c")
    return git


def test_sweep_run_refuses_a_dirty_tree(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git_repo(repo)
    monkeypatch.setattr(sweep, "REPO", str(repo))
    assert rec.git_state(str(repo))["clean"]
    (repo / "experiments" / "repro" / "runs" / "sao").mkdir(parents=True)
    (repo / "experiments" / "repro" / "runs" / "sao" / "new.json").write_text("{}")
    assert rec.git_state(str(repo))["clean"]           # the records folder does not count
    (repo / "code.py").write_text("x = 2\n")
    state = rec.git_state(str(repo))
    assert not state["clean"] and state["changes"] == [" M code.py"]
    with pytest.raises(RuntimeError, match="uncommitted changes.*code.py"):
        sweep.run(str(tmp_path / "runs"), ["sao"], [0], [], records=None)
    assert not (tmp_path / "runs").exists()            # refused before anything was written


def _finished_run(d, *, clean=True, steps=40, seconds=300.0):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump({"steps": steps, "accuracy_after": 0.5}, f)
    with open(os.path.join(d, "attempts.json"), "w") as f:
        json.dump({"runs": [{"rc": 0, "seconds": seconds, "commit": "a" * 40, "clean": clean}]}, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "phase": "rl", "learner/step": 1.0, "time/update_s": 1.0,
                            "time/update_cpu_s": 0.9}) + "\n{truncated")


def test_finished_clean_runs_are_recorded_small_and_a_new_machine_skips_them(tmp_path,
                                                                             monkeypatch):
    runs, records = tmp_path / "runs", str(tmp_path / "records")
    _finished_run(sweep.run_dir(str(runs), "grpo", 0), clean=False)
    assert not rec.record_run(sweep.run_dir(str(runs), "grpo", 0), rec.record_dir(records, "grpo", 0))
    for arm in ("sao", "grpo"):
        _finished_run(sweep.run_dir(str(runs), arm, 0))
        assert rec.record_run(sweep.run_dir(str(runs), arm, 0), rec.record_dir(records, arm, 0))
    lines = open(os.path.join(rec.record_dir(records, "sao", 0), "metrics.jsonl")).read().splitlines()
    assert [json.loads(x) for x in lines] == [{"step": 1, "phase": "rl", "learner/step": 1.0,
                                               "time/update_s": 1.0}]
    # A new machine: an empty runs directory, the records from the checkout. Nothing runs
    # (a run or SFT would start this command, which fails), every run is done.
    monkeypatch.setattr(sweep, "_python_cmd", lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    fresh = str(tmp_path / "new-machine")
    states = sweep.run(fresh, ["sao", "grpo"], [0], [], allow_dirty=True, records=records)
    assert states == {("sao", 0): "done", ("grpo", 0): "done"}
    assert not os.path.exists(sweep.sft_dir(fresh, 0))
    loaded = results.load_all(records, ["sao", "grpo"], [0])
    assert [r.state for r in loaded["sao"]] == ["done"]
    assert results.load_run(str(runs), "grpo", 0).state == "done"          # rewritten clean
    _finished_run(sweep.run_dir(str(runs), "vapo", 0), clean=False)
    assert results.load_run(str(runs), "vapo", 0).state == "dirty"         # never reported


def test_status_shows_percent_done_and_an_eta(tmp_path):
    records = str(tmp_path / "records")
    text = progress.status(str(tmp_path / "runs"), ["sao", "grpo"], [0], records=records)
    assert "0/2 runs done, 0% of" in text and f"the prior {base.PRIOR_S_PER_STEP} s" in text
    _finished_run(rec.record_dir(records, "sao", 0), steps=42, seconds=420.0)
    text = progress.status(str(tmp_path / "runs"), ["sao", "grpo"], [0], records=records)
    planned = {a: sweep.arm_config(a, 0, []).run.steps for a in ("sao", "grpo")}
    pct = round(100 * planned["sao"] / (planned["sao"] + planned["grpo"]))
    assert f"1/2 runs done, {pct}% of {sum(planned.values())} learner steps" in text
    eta_h = (planned["grpo"] * 420.0 / planned["sao"] + base.PRIOR_SFT_S) / 3600  # + its SFT
    assert f"ETA {eta_h:.1f} h at 10.0 s per learner step measured on 1 finished run(s)" in text
    assert "including 1 SFT warm start(s)" in text     # seed 0 still needs its warm start here


def test_eval_noise_is_paired_and_leaves_drift_arms_out():
    def run(arm, solved):
        rl = [{"step": 40, "eval/accuracy": float(np.mean(solved)) / 4,
               "eval/solved_per_prompt": solved}]
        return results.Run(arm, 0, "done", {"eval_samples_per_prompt": 4}, rl)
    a, b = [4, 3, 0, 2, 1, 4], [3, 3, 1, 2, 0, 4]
    text = verdicts.eval_noise({"m_sao": [run("m_sao", a)], "m_grpo": [run("m_grpo", b)],
                                "m_drift_sao": [run("m_drift_sao", [0] * 6)]})
    d = (np.array(a) - np.array(b)) / 4
    se = np.std(d, ddof=1) / np.sqrt(6)
    assert f"standard error of {100 * se:.1f}-{100 * se:.1f} points (1 seed(s))" in text
    assert "independent" not in text and "√2" not in text


def test_verdict_words_in_the_report_come_from_the_rule():
    # AUC of 4 seeds: SAO 3-5 points above GRPO + DIS on every seed (supported), GRPO + DIS
    # vs GRPO both ways (inconclusive, with its detectable effect).
    def run(arm, seed, level):
        rl = [{"step": 0, "eval/accuracy": 0.5}]
        rl += [{"step": v, "learner/policy_version": float(v), "eval/accuracy": level}
               for v in range(10, n + 1, 10)]
        return results.Run(arm, seed, "done", {"accuracy_after": level}, rl)
    n = mech.STEPS                                     # the round-two arms' actor updates
    assert results.actor_updates("m_sao") == n and results.actor_updates("sao") == base.STEPS
    gaps = {"sao": [0.04, 0.05, 0.03, 0.05], "grpo": [0.02, -0.03, 0.01, -0.02]}
    runs = {"m_grpo_dis": [run("m_grpo_dis", s, 0.6) for s in range(4)],
            "m_sao": [run("m_sao", s, 0.6 + g) for s, g in enumerate(gaps["sao"])],
            "m_grpo": [run("m_grpo", s, 0.6 + g) for s, g in enumerate(gaps["grpo"])]}
    assert runs["m_sao"][0].auc() == pytest.approx((0.5 * 5 + 0.64 * (n - 5)) / n)
    table = verdicts.verdict_table(runs)
    row = {line.split(".")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert "**supported**" in row["1a"] and "| 4 |" in row["1a"]
    assert "**inconclusive at this n (n = 4)**" in row["1b"]
    v = results.verdict([-g * (n - 5) / n for g in gaps["grpo"]], +1)   # AUC: grpo_dis - grpo
    assert f"{100 * v['mde']:.2f} |" in row["1b"]
    assert "**not measured**" in row["6"]


def test_the_records_folder_is_not_ignored_by_git():
    # .gitignore ignores every runs/ directory; the committed records must not be.
    out = subprocess.run(["git", "-C", ROOT, "check-ignore", "-q",
                          os.path.join(rec.RECORDS, "sao", "seed0", "summary.json")])
    assert out.returncode == 1
