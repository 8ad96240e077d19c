"""Pure parts of the SWE tasks: trees, splices, the grading overlay, junit
outcomes, the editor, tool-call parsing (no sandbox)."""
from __future__ import annotations

import json

import pytest

from sao.envs.swe import actions, editor, files, junit


def test_splice_round_trip_and_check():
    before = b"a\nb\nc\nd\n"
    after = b"a\nB\nc\nd\n"
    edit = files.splice(before, after)
    assert edit == {"start": 1, "old": ["b\n"], "new": ["B\n"]}
    assert files.apply_splice(before, edit) == after
    with pytest.raises(ValueError, match="does not apply"):
        files.apply_splice(after, edit)


def test_overlay_restores_tests_and_config_keeps_source_changes():
    base = {"pkg/m.py": b"x = 1\n", "tests/test_m.py": b"assert 1\n", "test_top.py": b"t\n",
            "setup.cfg": b"[tool:pytest]\n"}
    work = {"pkg/m.py": b"x = 2\n", "pkg/new.py": b"y\n", "tests/test_m.py": b"pass\n",
            "conftest.py": b"evil\n", "setup.cfg": b"addopts = -k nothing\n"}
    out = files.overlay_editable(base, work)
    assert out == {"pkg/m.py": b"x = 2\n", "pkg/new.py": b"y\n",
                   "tests/test_m.py": b"assert 1\n", "test_top.py": b"t\n",
                   "setup.cfg": b"[tool:pytest]\n"}
    # A protected path (e.g. from a SWE-bench test_patch) is restored too.
    assert files.overlay_editable(base, work, protected=["pkg/m.py"])["pkg/m.py"] == b"x = 1\n"


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../x", ".git/config"])
def test_check_path_rejects(path):
    with pytest.raises(ValueError):
        files.check_path(path)


def test_unified_diff_and_tree_hash():
    a, b = {"m.py": b"x = 1\n"}, {"m.py": b"x = 2\n", "n.py": b"new\n"}
    diff = files.unified_diff(a, b)
    assert "diff --git a/m.py b/m.py" in diff and "-x = 1" in diff and "+x = 2" in diff
    assert "--- /dev/null" in diff
    assert files.changed_lines(a, b) == 3
    assert files.tree_hash(a) == files.tree_hash(dict(a)) != files.tree_hash(b)


REPORT = b"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_x.TestA" name="test_b[a b-1]" time="0.1"/>
<testcase classname="tests.test_x" name="test_c" time="0.1"><failure message="x">t</failure></testcase>
<testcase classname="test_top" name="test_d" time="0.1"><skipped message="s"/></testcase>
<testcase classname="test_top" name="test_e" time="0.1"/>
<testcase classname="test_top" name="test_e" time="0.1"><error message="teardown"/></testcase>
</testsuite></testsuites>"""


def test_junit_node_ids_and_outcomes():
    out = junit.parse_report(REPORT, ["tests/test_x.py", "test_top.py", "README"])
    assert out == {"tests/test_x.py::TestA::test_b[a b-1]": "passed",
                   "tests/test_x.py::test_c": "failed", "test_top.py::test_d": "skipped",
                   "test_top.py::test_e": "failed"}


@pytest.mark.parametrize("bad", [None, b"", b"<testsuites><testcase", b"not xml",
                                 b'<!DOCTYPE x [<!ENTITY a "aaaa">]><testsuites/>'])
def test_junit_bad_reports_give_no_outcomes(bad):
    assert junit.parse_report(bad, ["a.py"]) == {}


def test_editor_commands():
    fs = {"pkg/m.py": b"a = 1\nb = 2\n"}
    assert "1\ta = 1" in editor.run_editor(fs, {"command": "view", "path": "/tmp/repo/pkg/m.py"})
    assert editor.run_editor(fs, {"command": "view", "path": "pkg"}) == "pkg/m.py"
    editor.run_editor(fs, {"command": "str_replace", "path": "pkg/m.py", "old_str": "b = 2",
                           "new_str": "b = 3"})
    editor.run_editor(fs, {"command": "insert", "path": "pkg/m.py", "insert_line": 0,
                           "new_str": "# top"})
    editor.run_editor(fs, {"command": "create", "path": "pkg/n.py", "file_text": "c = 4\n"})
    assert fs == {"pkg/m.py": b"# top\na = 1\nb = 3\n", "pkg/n.py": b"c = 4\n"}
    assert "2\ta = 1" in editor.run_editor(fs, {"command": "view", "path": "pkg/m.py",
                                                  "view_range": [2, 2]})


@pytest.mark.parametrize("args, msg", [
    ({"command": "str_replace", "path": "m.py", "old_str": "x", "new_str": "y"}, "exactly once"),
    ({"command": "str_replace", "path": "nope.py", "old_str": "a", "new_str": "b"}, "not exist"),
    ({"command": "create", "path": "m.py", "file_text": ""}, "already exists"),
    ({"command": "insert", "path": "m.py", "insert_line": 99, "new_str": "z"}, "insert_line"),
    ({"command": "view", "path": "../etc/passwd"}, "inside the repository"),
    ({"command": "delete", "path": "m.py"}, "unknown editor command"),
    ({"command": "view", "path": "m.py", "view_range": [5, 9]}, "outside"),
])
def test_editor_errors(args, msg):
    fs = {"m.py": b"xx = 1\n"}
    with pytest.raises(editor.EditorError, match=msg):
        editor.run_editor(fs, args)
    assert fs == {"m.py": b"xx = 1\n"}


def test_parse_action_formats():
    P = actions.parse_action
    assert P("<python>ls -la</python>", "tags") == actions.Action("bash", {"command": "ls -la"})
    call = {"name": "str_replace_editor", "arguments": {"command": "view", "path": "m.py"}}
    assert P(f"<python>{json.dumps(call)}</python>", "tags").tool == "str_replace_editor"
    assert P("<answer>done</answer>", "tags").tool == "submit"
    assert P("thinking", "tags") == actions.Action()
    hermes = '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>'
    assert P(hermes, "hermes") == actions.Action("bash", {"command": "ls"})
    assert P('<tool_call>{"name": "submit"}</tool_call>', "hermes").tool == "submit"
    assert "not valid JSON" in P("<tool_call>{bad</tool_call>", "hermes").error
    assert "unknown tool" in P('<tool_call>{"name": "rm"}</tool_call>', "hermes").error
    assert "bash needs" in P('<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
                             "hermes").error


def test_render_output_notes_and_clip():
    text = actions.render_output("x" * 5000 + "<answer>", returncode=2, timed_out=True,
                                 truncated=True, error=None, max_chars=300)
    assert len(text) <= 300 and text.endswith("[timed out] [output truncated] [exit status 2]")
    assert "[...]" in text and "<answer>" not in text
