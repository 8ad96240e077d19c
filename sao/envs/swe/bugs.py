"""Bug injection: SWE-smith's procedural modifiers, plus one of ours.

The modifiers of the ``swesmith`` package (``swesmith.bug_gen.procedural.python``:
change / flip / swap operators, break chains, change constants, remove
conditionals / loops / assignments / wrappers, invert if-else, shuffle lines,
class edits) are called directly on one function or class at a time, the
entities its own adapter extracts (``get_entities_from_file_py``), and the
rewrite is put back with its own ``apply_code_change``. No docker, no
profiles, no git.

**Ours: ``ComparisonFlipModifier``.** swesmith's operator flip visits only
binary and boolean operations, so a comparison (``<``, ``<=``, ``==``, ``in``,
``is``) is never mutated, yet an off-by-one boundary (``<`` for ``<=``) is
the commonest one-line bug. It flips one comparison operator to its
neighbour (``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <->
``not in``, ``is`` <-> ``is not``).

Everything is deterministic for a seed: files and entities in a fixed order,
a seeded shuffle of (entity, modifier) pairs, and each modifier seeded from
(seed, file, entity, modifier).
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import os
import random
import tempfile
from typing import Iterator, Mapping, Sequence

from sao.envs.swe.files import is_test_path, splice

# The likelihoods swesmith's own MODIFIERS_PYTHON list uses.
_LIKELIHOODS = {
    "ClassRemoveBasesModifier": 0.25, "ClassRemoveFuncsModifier": 0.15,
    "ClassShuffleMethodsModifier": 0.25, "ControlIfElseInvertModifier": 0.25,
    "ControlShuffleLinesModifier": 0.25, "RemoveAssignModifier": 0.25,
    "RemoveConditionalModifier": 0.25, "RemoveLoopModifier": 0.25,
    "RemoveWrapperModifier": 0.25, "OperationBreakChainsModifier": 0.4,
    "OperationChangeConstantsModifier": 0.4, "OperationChangeModifier": 0.4,
    "OperationSwapOperandsModifier": 0.4, "OperationFlipOperatorModifier": 0.4,
    "ComparisonFlipModifier": 0.4,
}


@dataclasses.dataclass(frozen=True)
class Bug:
    """One injected bug: ``path`` changed from ``before`` to ``after`` by ``modifier``."""

    path: str
    modifier: str
    explanation: str
    entity: str
    before: bytes
    after: bytes

    @property
    def edit(self) -> dict:
        return splice(self.before, self.after)


def modifier_classes() -> list[type]:
    """swesmith's Python modifier classes (sorted by name) and ours."""
    from swesmith.bug_gen.procedural.python import (
        ClassRemoveBasesModifier, ClassRemoveFuncsModifier, ClassShuffleMethodsModifier,
        ControlIfElseInvertModifier, ControlShuffleLinesModifier, OperationBreakChainsModifier,
        OperationChangeConstantsModifier, OperationChangeModifier, OperationSwapOperandsModifier,
        RemoveAssignModifier, RemoveConditionalModifier, RemoveLoopModifier,
        RemoveWrapperModifier)
    from swesmith.bug_gen.procedural.python.operations import OperationFlipOperatorModifier
    classes = [ClassRemoveBasesModifier, ClassRemoveFuncsModifier, ClassShuffleMethodsModifier,
               ControlIfElseInvertModifier, ControlShuffleLinesModifier,
               OperationBreakChainsModifier, OperationChangeConstantsModifier,
               OperationChangeModifier, OperationSwapOperandsModifier,
               OperationFlipOperatorModifier, RemoveAssignModifier, RemoveConditionalModifier,
               RemoveLoopModifier, RemoveWrapperModifier, _comparison_flip_class()]
    return sorted(classes, key=lambda c: c.__name__)


def _comparison_flip_class() -> type:
    import libcst
    from swesmith.bug_gen.procedural.python.base import PythonProceduralModifier
    from swesmith.constants import CodeProperty

    flips = {libcst.LessThan: libcst.LessThanEqual, libcst.LessThanEqual: libcst.LessThan,
             libcst.GreaterThan: libcst.GreaterThanEqual,
             libcst.GreaterThanEqual: libcst.GreaterThan, libcst.Equal: libcst.NotEqual,
             libcst.NotEqual: libcst.Equal, libcst.In: libcst.NotIn, libcst.NotIn: libcst.In,
             libcst.Is: libcst.IsNot, libcst.IsNot: libcst.Is}

    class ComparisonFlipModifier(PythonProceduralModifier):
        explanation = "A comparison in the code is likely wrong (for example at a boundary)."
        name = "sao_comparison_flip"
        conditions = [CodeProperty.IS_FUNCTION]

        class Transformer(PythonProceduralModifier.Transformer):
            def leave_ComparisonTarget(self, original_node, updated_node):
                new = flips.get(type(updated_node.operator))
                if new is not None and self.flip():
                    return updated_node.with_changes(operator=new())
                return updated_node

    return ComparisonFlipModifier


def _seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


def source_paths(files: Mapping[str, bytes], src_dirs: Sequence[str]) -> list[str]:
    """Python files under ``src_dirs`` that are not tests, sorted."""
    return sorted(p for p in files if p.endswith(".py") and not is_test_path(p)
                  and any(p == d or p.startswith(d.rstrip("/") + "/") for d in src_dirs))


def generate_bugs(files: Mapping[str, bytes], src_dirs: Sequence[str], *, seed: int,
                  max_changed_lines: int = 4, min_complexity: int | None = None) -> Iterator[Bug]:
    """Candidate bugs of a repository, lazily, in a seeded order.

    Args:
      files: the repository.
      src_dirs: where bugs may go (``source_paths``).
      seed: fixes the order and every modifier's choices.
      max_changed_lines: largest edit kept (lines replaced or inserted,
        whichever is more); 1 gives one-line bugs (exactly one line changed).
      min_complexity: overrides the modifiers' minimum entity complexity
        (tiny functions of the micro tier are below swesmith's defaults).

    Yields distinct ``Bug``s whose result still parses; it does not run tests.
    """
    from swesmith.bug_gen.adapters.python import get_entities_from_file_py
    from swesmith.bug_gen.utils import apply_code_change

    classes = modifier_classes()
    with tempfile.TemporaryDirectory(prefix="sao-swe-bugs-") as tmp:
        pairs = []
        for path in source_paths(files, src_dirs):
            local = os.path.join(tmp, path)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as f:
                f.write(files[path])
            entities: list = []
            get_entities_from_file_py(entities, local)
            pairs += [(path, local, i, ent, cls) for i, ent in enumerate(entities)
                      for cls in classes]
        random.Random(seed).shuffle(pairs)
        seen: set[bytes] = set()
        for path, local, index, entity, cls in pairs:
            pm = cls(likelihood=_LIKELIHOODS.get(cls.__name__, 0.25),
                     seed=_seed(seed, path, index, cls.__name__))
            if min_complexity is not None:
                pm.min_complexity = min_complexity
            if not pm.can_change(entity):
                continue
            try:
                rewrite = pm.modify(entity)
            except Exception:  # noqa: BLE001 - a modifier crashing on odd code skips the pair
                continue
            if rewrite is None:
                continue
            with open(local, "wb") as f:
                f.write(files[path])
            try:
                apply_code_change(entity, rewrite)
            except ValueError:
                continue
            with open(local, "rb") as f:
                after = f.read()
            if after == files[path] or after in seen:
                continue
            try:
                ast.parse(after)
            except SyntaxError:
                continue
            edit = splice(files[path], after)
            if max(len(edit["old"]), len(edit["new"])) > max_changed_lines:
                continue
            if max_changed_lines == 1 and len(edit["old"]) != len(edit["new"]):
                continue   # one-line bugs change a line; they neither add nor drop one
            seen.add(after)
            yield Bug(path=path, modifier=pm.name, explanation=pm.explanation,
                      entity=getattr(entity, "name", ""), before=files[path], after=after)
