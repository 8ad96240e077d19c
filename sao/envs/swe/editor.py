"""The file editor tool: view / create / str_replace / insert on a working copy.

Like SWE-agent's and OpenHands' ``str_replace_editor``. It works on the
repository held as data (``Files``), on the host, as pure string operations:
nothing is executed and no host file is touched, so it needs no sandbox (the
bash tool's commands do). Paths are relative to the repository root or
absolute under ``REPO_DIR``. Every failure is an ``EditorError`` whose
message is shown to the agent.
"""
from __future__ import annotations

from typing import Any, Mapping

from sao.envs.swe.files import Files, check_path
from sao.envs.swe.workspace import REPO_DIR

COMMANDS = ("view", "create", "str_replace", "insert")
MAX_FILE_BYTES = 1 << 20


class EditorError(ValueError):
    """A rejected editor call (bad path, missing or ambiguous text, ...)."""


def _path(path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise EditorError("`path` must be a non-empty string")
    if path == REPO_DIR or path == REPO_DIR + "/":
        return "."
    if path.startswith(REPO_DIR + "/"):
        path = path[len(REPO_DIR) + 1:]
    try:
        return check_path(path)
    except ValueError as e:
        raise EditorError(str(e)) from e


def _text(files: Mapping[str, bytes], path: str) -> str:
    if path not in files:
        raise EditorError(f"{path} does not exist")
    try:
        return files[path].decode("utf-8")
    except UnicodeDecodeError as e:
        raise EditorError(f"{path} is not UTF-8 text") from e


def _arg(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise EditorError(f"`{name}` (a string) is required")
    return value


def view(files: Mapping[str, bytes], path: str, view_range: Any = None) -> str:
    """A file with line numbers (``cat -n`` style; ``view_range`` ``[start,
    end]``, 1-based, end -1 for the last line), or a directory's files."""
    path = _path(path)
    if path not in files:
        prefix = "" if path == "." else path + "/"
        below = sorted(p for p in files if p.startswith(prefix))
        if not below:
            raise EditorError(f"{path} does not exist")
        return "\n".join(below)
    lines = _text(files, path).split("\n")
    start, end = 1, len(lines)
    if view_range is not None:
        if (not isinstance(view_range, (list, tuple)) or len(view_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)):
            raise EditorError("`view_range` must be [start, end] (integers)")
        start, end = view_range[0], (len(lines) if view_range[1] == -1 else view_range[1])
        if not 1 <= start <= max(end, 1) or end > len(lines):
            raise EditorError(f"`view_range` {list(view_range)} is outside 1..{len(lines)}")
    return "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(start, end + 1))


def create(files: Files, path: str, file_text: str) -> str:
    path = _path(path)
    if path in files:
        raise EditorError(f"{path} already exists; use str_replace to change it")
    data = file_text.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise EditorError(f"file_text is larger than {MAX_FILE_BYTES} bytes")
    files[path] = data
    return f"created {path}"


def str_replace(files: Files, path: str, old_str: str, new_str: str) -> str:
    path = _path(path)
    text = _text(files, path)
    count = text.count(old_str) if old_str else 0
    if count != 1:
        raise EditorError(f"`old_str` must occur exactly once in {path}; it occurs {count} times")
    files[path] = text.replace(old_str, new_str, 1).encode("utf-8")
    line = text[:text.index(old_str)].count("\n") + 1
    return f"edited {path} at line {line}"


def insert(files: Files, path: str, insert_line: Any, new_str: str) -> str:
    path = _path(path)
    lines = _text(files, path).split("\n")
    if not isinstance(insert_line, int) or isinstance(insert_line, bool) \
            or not 0 <= insert_line <= len(lines):
        raise EditorError(f"`insert_line` must be an integer in 0..{len(lines)}")
    new = new_str.split("\n")
    files[path] = "\n".join(lines[:insert_line] + new + lines[insert_line:]).encode("utf-8")
    return f"inserted {len(new)} line(s) after line {insert_line} of {path}"


def run_editor(files: Files, args: Mapping[str, Any]) -> str:
    """Runs one editor call ``{"command": ..., "path": ..., ...}`` on ``files``
    (modified in place for create / str_replace / insert); returns the
    observation text. Raises EditorError on a bad call."""
    if not isinstance(args, Mapping):
        raise EditorError("editor arguments must be an object")
    command = args.get("command")
    if command == "view":
        return view(files, _arg(args, "path"), args.get("view_range"))
    if command == "create":
        return create(files, _arg(args, "path"), _arg(args, "file_text"))
    if command == "str_replace":
        return str_replace(files, _arg(args, "path"), _arg(args, "old_str"),
                           args.get("new_str", "") if isinstance(args.get("new_str", ""), str)
                           else _arg(args, "new_str"))
    if command == "insert":
        return insert(files, _arg(args, "path"), args.get("insert_line"), _arg(args, "new_str"))
    raise EditorError(f"unknown editor command {command!r}; expected one of {COMMANDS}")
