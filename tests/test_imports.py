"""No import circle in ``sao/``.

Every module under ``sao/`` is parsed with `ast`; every ``import`` statement
anywhere in it (module level, inside functions and classes, under ``if``
blocks) gives an edge to the ``sao.*`` module it names: the submodule when
``from a import b`` names one, else the module or package itself. The graph
of those edges must have no cycle.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "sao"


def module_files(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """``{dotted module name: file}`` for every ``.py`` under ``root/package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, level: int, module: str, is_package: bool) -> str:
    """Absolute name of a (possibly relative) ``from`` import target."""
    if level == 0:
        return name
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imported_modules(tree: ast.AST, module: str, is_package: bool,
                     known: set[str]) -> set[str]:
    """The ``known`` modules that the import statements of ``tree`` name."""
    out: set[str] = set()

    def add(name: str) -> None:
        # ``import a.b.c`` runs a, a.b and a.b.c; the most specific known
        # module is the dependency (its parents are entered on the way).
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, module, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
    out.discard(module)
    return out


def import_graph(root: pathlib.Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over the ``package`` modules."""
    files = module_files(root, package)
    known = set(files)
    return {mod: imported_modules(ast.parse(path.read_text(encoding="utf-8"), str(path)),
                                  mod, path.name == "__init__.py", known)
            for mod, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None if the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles covering every circle: find one, drop its closing edge, repeat."""
    graph = {k: set(v) for k, v in graph.items()}
    cycles = []
    while (cycle := find_cycle(graph)) is not None:
        cycles.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    return cycles


def test_graph_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import pkg.b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("if True:\n    from ..a import x\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
    (pkg / "b.py").write_text("import pkg.a\nimport pkg.sub.c\n")
    (pkg / "sub" / "c.py").write_text("from pkg import a\n")
    assert import_cycles(import_graph(tmp_path, "pkg")) == [
        ["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    (pkg / "b.py").write_text("")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None


def test_no_import_cycle_in_sao():
    graph = import_graph()
    assert len(graph) > 50 and "sao.learner.learner" in graph
    cycles = import_cycles(graph)
    if cycles:
        pytest.fail("import cycles in sao/:\n" + "\n".join(" -> ".join(c) for c in cycles))
