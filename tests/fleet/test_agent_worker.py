"""The worker running the real agent loop (sao.rollout.run_episode) behind gRPC."""
from sao.envs.base import Env, StepResult, make_prompt
from sao.fleet.dispatcher import Dispatcher, DispatcherConfig
from sao.fleet.local import ThreadedWorker
from sao.fleet.worker import WorkerConfig, agent_episode_fn
from sao.models.tokenizer import ByteTokenizer
from sao.rollout import SamplingParams, ScriptedEngine, ScriptedTurn


class EchoToolEnv(Env):
    """First turn: a tool call answered with 'ok'; second turn: done, reward 1."""

    def reset(self, prompt):
        self.turns = 0
        return prompt["text"]

    def step(self, action_text):
        self.turns += 1
        if self.turns == 1:
            return StepResult("ok", done=False)
        return StepResult(None, done=True, reward=1.0, info={"answer": action_text})


def test_agent_loop_trajectory_crosses_the_wire_with_versions():
    tok = ByteTokenizer()
    ids = tok.special_ids
    call = [*tok.encode("1+1"), ids["</python>"]]
    answer = [*tok.encode("2"), ids["</answer>"]]

    def make():
        engine = ScriptedEngine([ScriptedTurn(call), ScriptedTurn(answer, swap_to={1: 1})])
        return engine, agent_episode_fn(engine, EchoToolEnv, tok, SamplingParams(max_new_tokens=16),
                                        max_turns=4, max_total_tokens=128)

    prompt = make_prompt("q1", "echo", "Q?", {"gold": "2"})
    # The learner is at version 1; the scripted engine swaps 0 -> 1 mid-answer.
    cfg = DispatcherConfig(batch_size=1, vocab_size=tok.vocab_size, tau=2, initial_version=1)
    with ThreadedWorker(make, WorkerConfig()) as w, Dispatcher([w.address], [prompt], cfg) as d:
        [t] = d.get_batch(timeout=30)
        assert d.snapshot()["drops"] == {}
    prompt_ids = tok.encode("Q?")
    obs = [ids["<output>"], *tok.encode("ok"), ids["</output>"]]
    assert t.tokens.tolist() == prompt_ids + call + obs + answer
    assert t.action_mask.tolist() == [False] * 2 + [True] * 4 + [False] * 4 + [True] * 2
    assert t.reward == 1.0 and t.finish == "stop" and t.prompt_id == "q1"
    assert t.policy_version[t.action_mask].tolist() == [0, 0, 0, 0, 0, 1]
    assert t.metadata["num_turns"] == 2 and t.metadata["num_tool_calls"] == 1
    assert t.metadata["answer"] == tok.decode(answer)
