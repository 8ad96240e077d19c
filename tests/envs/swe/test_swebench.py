"""SWE-bench instances read from a local git checkout (made here): the gold
patch scores 1, no patch 0, deleting the tests 0; malformed instances are
rejected by name."""
from __future__ import annotations

import json
import subprocess

import pytest

from sao.envs import EpisodeConfig, make_task
from sao.envs.swe import SweEnv, grade_patch, load_instances
from sao.envs.swe.files import unified_diff

OPS = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
TESTS = "from mathy.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TESTS_NEW = TESTS + "\n\ndef test_mul():\n    from mathy.ops import mul\n    assert mul(2, 3) == 6\n"


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkouts")
    repo = root / "acme__mathy"
    (repo / "mathy").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "mathy" / "__init__.py").write_text("")
    (repo / "mathy" / "ops.py").write_text(OPS)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # A later commit the instance must not see.
    (repo / "mathy" / "ops.py").write_text(OPS.replace("return a + b\n", "return a * b\n", 1))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "later")
    fixed = OPS.replace("def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b")
    instance = {
        "repo": "acme/mathy", "instance_id": "acme__mathy-1", "base_commit": base,
        "patch": unified_diff({"mathy/ops.py": OPS.encode()}, {"mathy/ops.py": fixed.encode()}),
        "test_patch": unified_diff({"tests/test_ops.py": TESTS.encode()},
                                   {"tests/test_ops.py": TESTS_NEW.encode()}),
        "problem_statement": "mul(2, 3) returns 5, it should return 6.",
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_mul"]),
        "PASS_TO_PASS": ["tests/test_ops.py::test_add"],
    }
    path = root / "instances.jsonl"
    path.write_text(json.dumps(instance) + "\n")
    return path, root, instance


def test_instances_load_and_grade(sandbox, bench):
    path, root, instance = bench
    (entry,) = load_instances(path, root)
    assert entry["FAIL_TO_PASS"] == ["tests/test_ops.py::test_mul"]
    assert entry["protected_files"] == ["tests/test_ops.py"]
    assert entry["test_spec"]["test_files"] == ["tests/test_ops.py"]
    assert grade_patch(entry, instance["patch"])["correct"] == 1.0
    none = grade_patch(entry, "")
    assert none["correct"] == 0.0 and none["tests_passed"] == 1 and none["tests_total"] == 2


def test_episode_on_an_instance(sandbox, bench):
    path, root, _ = bench
    task = make_task("swe/bench", path=str(path), checkouts=str(root))
    (record,) = task.records()
    env = SweEnv(task, EpisodeConfig(tool_format="tags", max_turns=5, max_tool_calls=4,
                                     tool_timeout_s=20.0))
    env.reset(record)
    # The starting tree is the base commit's, not the later one's.
    assert env.workspace.files["mathy/ops.py"].decode() == OPS
    env.step("<python>rm -rf tests</python>")
    res = env.step("<answer>done</answer>")
    assert res.reward == 0.0 and res.info["tests_passed"] == 1   # tests restored, mul still wrong
    env.reset(record)
    env.step("<python>sed -i '6s/a + b/a * b/' mathy/ops.py</python>")
    res = env.step("<answer>done</answer>")
    assert res.reward == 1.0 and res.info["tests_passed"] == 2


@pytest.mark.parametrize("change, msg", [
    ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS is not a JSON list"),
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS is empty"),
    ({"patch": 3}, "patch must be a string"),
    ({"repo": "acme/other"}, "no git checkout"),
    ({"base_commit": "$(rm -rf /)"}, "bad base_commit"),
])
def test_malformed_instances_are_rejected(bench, tmp_path, change, msg):
    _, root, instance = bench
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([dict(instance, **change)]))
    with pytest.raises(ValueError, match=msg):
        load_instances(bad, root)
