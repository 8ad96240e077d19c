"""Online drift environment, judges (rule-based and an OpenAI-compatible fake) and lag metric."""
import http.server
import json
import threading
import time

import numpy as np
import pytest

from sao.envs.base import Task, make_prompt
from sao.envs.drift import (DriftEnv, DriftSchedule, LearnerClock, adaptation_lag,
                            drift_summary, phase_rewards)
from sao.envs.judges import JudgeError, OpenAIJudge, RuleJudge, Verdict, parse_verdict


class SumTask(Task):
    """Tiny exact-answer task (no reasoning-gym import needed)."""
    name = "sum"

    def records(self):
        return [make_prompt(f"sum/{a}", "sum", f"What is {a} + {a}?", {"answer": str(2 * a)})
                for a in range(1, 4)]

    def grade(self, answer, entry):
        return 1.0 if answer.strip() == entry["answer"] else 0.0


def test_schedule_phases():
    sched = DriftSchedule(("bare", "sentence", "boxed"), (150, 300))
    assert [sched.style(s) for s in (0, 149, 150, 299, 300, 10_000)] == \
        ["bare", "bare", "sentence", "sentence", "boxed", "boxed"]
    for bad in [dict(styles=("bare",), switch_steps=(5,)),
                dict(styles=("bare", "sentence"), switch_steps=(0,)),
                dict(styles=("bare", "sentence", "boxed"), switch_steps=(9, 9)),
                dict(styles=("bare", "italic"), switch_steps=(5,))]:
        with pytest.raises(ValueError):
            DriftSchedule(**bad)
    with pytest.raises(ValueError):
        sched.phase(-1)


def test_rule_judge_quality_and_style():
    judge, entry = RuleJudge(SumTask()), {"answer": "4"}
    cases = {("4", "bare"): (1, 1), ("The answer is 4.", "sentence"): (1, 1),
             ("\\boxed{4}", "boxed"): (1, 1), ("The answer is 4.", "bare"): (1, 0),
             ("5", "bare"): (0, 1), ("\\boxed{5}", "boxed"): (0, 1), ("four", "bare"): (0, 0)}
    for (answer, style), (q, s) in cases.items():
        v = judge.judge("What is 2 + 2?", answer, entry, style)
        assert (v.quality, v.style) == (q, s), (answer, style, v)


def test_drift_env_reward_follows_the_learner_clock():
    clock = LearnerClock()
    env = DriftEnv(SumTask(), DriftSchedule(("bare", "sentence"), (10,)), clock)
    rec = SumTask().records()[1]                      # 2 + 2
    infos = []
    for step, answer, expected in [(0, "4", 1.0), (0, "The answer is 4.", 0.0),
                                   (12, "4", 0.0), (12, "The answer is 4.", 1.0),
                                   (12, "The answer is 5.", 0.0)]:
        clock.set(step)
        env.reset(rec)
        result = env.step(f"<answer>{answer}</answer>")
        assert result.done and result.reward == expected, (step, answer)
        assert result.info["required_style"] == ("bare" if step < 10 else "sentence")
        infos.append(result.info)
    assert phase_rewards(infos) == {0: 0.5, 1: 1 / 3}


def test_adaptation_lag_hand_computed():
    steps = np.arange(0, 12)
    rewards = [0.9, 0.9, 0.1, 0.2, 0.5, 0.85, 0.9, 0.0, 0.1, 0.2, 0.3, 0.4]
    # switches at 2 and 7: recovers (>= 0.8) at step 5 (lag 3); never after 7.
    assert adaptation_lag(steps, rewards, [2, 7], level=0.8) == [3, None]
    # window 2: mean(0.5, 0.85) < 0.8, mean(0.85, 0.9) >= 0.8 at step 6.
    assert adaptation_lag(steps, rewards, [2, 7], level=0.8, window=2) == [4, None]
    assert adaptation_lag(steps, rewards, [2], level=0.1) == [0]
    with pytest.raises(ValueError):
        adaptation_lag([0, 0], [1, 1], [1], level=0.5)
    with pytest.raises(ValueError):
        adaptation_lag([0, 1], [1], [1], level=0.5)


def test_drift_summary_from_run_records():
    # Versions 0-3 at reward 1.0, the style switches at 4: reward 0, then
    # 0.5 and 0.95 (recovered at version 6 with window 1: 0.9 * 1.0 <= 0.95).
    # Versions 5 and 6 each trained twice (async batches): averaged.
    rewards = {0: [1.0], 1: [1.0], 2: [1.0], 3: [1.0], 4: [0.0], 5: [0.4, 0.6], 6: [0.9, 1.0]}
    records = [{"step": i, "env/learner_step": v, "rollout/reward": r}
               for i, (v, r) in enumerate((v, r) for v, rs in rewards.items() for r in rs)]
    records.append({"step": 99, "rollout/reward": 0.0})  # no drift metadata: ignored
    out = drift_summary(records, [4], recovery_fraction=0.9, window=1)
    assert out["switch_steps"] == [4] and out["levels"] == [pytest.approx(0.9)]
    assert out["adaptation_lag"] == [2]
    assert out["phase_reward"] == {"0": 1.0, "1": pytest.approx((0.0 + 0.5 + 0.95) / 3)}
    # window 2: mean(0.5, 0.95) = 0.725 < 0.9: not recovered by the end of the run.
    assert drift_summary(records, [4], window=2)["adaptation_lag"] == [None]
    # A switch before any logged reward has no level to recover.
    assert drift_summary(records[4:], [2, 4])["levels"][0] is None
    # Nor one after a phase of zero reward (0.9 x 0 would call any reward "recovered").
    zero = [{"step": i, "env/learner_step": i, "rollout/reward": r}
            for i, r in enumerate([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])]
    out = drift_summary(zero, [2, 4], window=1)
    assert out["levels"] == [pytest.approx(0.45), None] and out["adaptation_lag"] == [None, None]


class _FakeJudge(http.server.BaseHTTPRequestHandler):
    """OpenAI-compatible fake: quality = reference appears in the answer;
    style = the answer is only a number (a rule of its own)."""
    requests = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, dict(self.headers), body))
        if body["model"] == "slow":
            time.sleep(1.0)
        if body["model"] == "broken":
            self._send(500, {"error": "boom"})
            return
        user = body["messages"][-1]["content"]
        reference = user.split("Reference answer: ")[1].split("\n")[0]
        answer = user.split("Answer to grade:\n")[1]
        verdict = {"quality": int(reference in answer), "style": int(answer.strip().isdigit())}
        content = "Sure. " + json.dumps(verdict) if body["model"] != "garbage" else "no json"
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}}]})

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_judge_against_fake_endpoint(fake_endpoint):
    _FakeJudge.requests.clear()
    judge = OpenAIJudge(fake_endpoint, "judge-model", api_key="k", timeout_s=5)
    v = judge.judge("What is 2 + 2?", "4", {"answer": "4"}, "bare")
    assert (v.quality, v.style) == (1.0, 1.0)
    path, headers, body = _FakeJudge.requests[-1]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k"
    assert body["model"] == "judge-model" and body["messages"][0]["role"] == "system"
    v = judge.judge("What is 2 + 2?", "The answer is 5.", {"answer": "4"}, "sentence")
    assert (v.quality, v.style) == (0.0, 0.0)

    clock = LearnerClock(3)
    env = DriftEnv(SumTask(), DriftSchedule(("bare", "boxed"), (100,)), clock, judge=judge)
    env.reset(SumTask().records()[0])
    assert env.step("<answer>2</answer>").reward == 1.0


def test_openai_judge_failures_raise(fake_endpoint):
    with pytest.raises(JudgeError, match="TimeoutError"):
        OpenAIJudge(fake_endpoint, "slow", timeout_s=0.3, max_retries=0).judge(
            "q", "4", {"answer": "4"}, "bare")
    _FakeJudge.requests.clear()
    with pytest.raises(JudgeError, match="HTTP 500"):
        OpenAIJudge(fake_endpoint, "broken", timeout_s=2, max_retries=1).judge(
            "q", "4", {"answer": "4"}, "bare")
    assert len(_FakeJudge.requests) == 2                  # retried once
    with pytest.raises(JudgeError, match="unparsable"):
        OpenAIJudge(fake_endpoint, "garbage", timeout_s=2, max_retries=0).judge(
            "q", "4", {"answer": "4"}, "bare")
    with pytest.raises(JudgeError):
        OpenAIJudge("http://127.0.0.1:9/v1", "m", timeout_s=1, max_retries=0).judge(
            "q", "4", {"answer": "4"}, "bare")


def test_parse_verdict():
    ok = json.dumps({"choices": [{"message": {"content": '{"quality": 1, "style": 0}'}}]})
    assert parse_verdict(ok) == Verdict(1.0, 0.0, '{"quality": 1, "style": 0}')
    with pytest.raises(ValueError):
        parse_verdict(json.dumps({"choices": [{"message": {"content": '{"quality": 3, "style": 0}'}}]}))
