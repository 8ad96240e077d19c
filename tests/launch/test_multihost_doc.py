"""docs/multihost.md's two-process example, run as written (a free port and a temporary
work dir substituted): 2 learner processes x 4 CPU devices finish 2 steps."""
import json
import os

import pytest

from cluster import ROOT, free_ports, run_shell, user_env


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_process_example_runs(tmp_path):
    text = (ROOT / "docs" / "multihost.md").read_text()
    block = text.split("On one machine (what the tests do)", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert "127.0.0.1:8476" in block and "runs/mp" in block
    command = block.replace("127.0.0.1:8476", f"127.0.0.1:{free_ports(1)}").replace(
        "runs/mp", str(tmp_path / "mp"))
    env = {k: v for k, v in user_env().items() if not k.startswith("JAX_")}
    out = run_shell(command, env, timeout=2300)
    summary = json.loads((tmp_path / "mp" / "summary.json").read_text()) \
        if (tmp_path / "mp" / "summary.json").exists() else None
    assert summary and summary["steps"] == 2, out.stdout[-3000:] + out.stderr[-5000:]
    assert os.path.exists(tmp_path / "mp" / "metrics.jsonl")
