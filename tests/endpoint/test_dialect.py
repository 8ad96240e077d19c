"""Tool-call formats: Hermes blocks parsed into tool calls, rendering as Qwen3's template."""
import json

from sao.envs import tools
from sao.fleet.endpoint.dialect import ByteTags, HermesChatML, hermes_tools_block
from sao.fleet.endpoint.messages import Message, ToolCall, ToolSpec, parse_request
from sao.models.tokenizer import ByteTokenizer


class ChatTok:
    special_ids = {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 0}
    stop_ids = (0, 2)
    chat_template = None


BASH = ToolSpec("bash", {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}})


def test_hermes_parse_calls_and_content():
    d = HermesChatML(ChatTok())
    text = ('Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"pwd\\"}"}'
            '\n</tool_call>')
    content, calls = d.parse(text, [BASH])
    assert content == "Let me look."
    assert [(n, json.loads(a)) for n, a in calls] == [("bash", {"command": "ls"}),
                                                      ("bash", {"command": "pwd"})]
    # a malformed block stays text: the harness sees what the model wrote
    content, calls = d.parse("<tool_call>\n{not json}\n</tool_call>", [BASH])
    assert calls == [] and "{not json}" in content
    assert d.parse("<tool_call>\n{\"name\": \"bash\"", [BASH]) == ('<tool_call>\n{"name": "bash"', [])
    assert d.stop_ids == (2, 0) and d.terminal_ids == (0,)


def test_hermes_rendering_matches_the_native_tool_prompt():
    py = ToolSpec("python", tools.PYTHON_TOOL_SCHEMA)
    assert hermes_tools_block([py]) == tools.hermes_system_prompt()
    d = HermesChatML(ChatTok())
    text = d.prompt_text([Message("user", "Q")], [py])
    assert text == (f"<|im_start|>system\n{tools.hermes_system_prompt()}<|im_end|>\n"
                    "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")
    # two tool results: one user turn of two <tool_response> blocks (Qwen3's template)
    cont = d.continuation_text([Message("tool", "a", tool_call_id="1"),
                                Message("tool", "b", tool_call_id="2")], last_token=2)
    assert cont == ("\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
                    "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    # a turn that ended without its end marker is closed first
    assert d.continuation_text([Message("user", "x")], last_token=7).startswith("<|im_end|>\n")
    m = Message("assistant", "hi", (ToolCall("c", "bash", '{"command": "ls"}'),))
    assert d.action_text(m) == ('hi\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
                                '</tool_call><|im_end|>')


def test_byte_tags_call_the_first_tool_with_its_first_parameter():
    d = ByteTags(ByteTokenizer())
    content, calls = d.parse("<python>cat a.py</python>", [BASH])
    assert content == "" and calls == [("bash", json.dumps({"command": "cat a.py"}))]
    assert d.parse("<answer>done</answer>", [BASH]) == ("done", [])
    assert d.continuation_text([Message("tool", "out", tool_call_id="1")], 260) == "<output>out</output>"


def test_message_keys_ignore_what_client_libraries_add():
    call = {"id": "call_1", "type": "function", "function": {"name": "bash",
                                                             "arguments": '{"command":"ls"}'}}
    ours = parse_request({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]})
    echoed = parse_request({"messages": [{"role": "assistant", "content": "", "function_call": None,
                                          "provider_specific_fields": {}, "tool_calls": [
        {**call, "id": "other", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}]})
    assert ours.messages[0].key() == echoed.messages[0].key()
