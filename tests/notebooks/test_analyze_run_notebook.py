"""notebooks/analyze_run.ipynb executes (nbclient, the venv's python3 kernel) on a tiny run's output."""
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
from test_main_support import ROOT, tiny_run  # noqa: E402


@pytest.mark.slow
def test_notebook_runs_on_a_tiny_run(monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    workdir, proc = tiny_run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("SAO_RUN_DIR", workdir)
    # The kernel spec runs "python": make it this interpreter (the venv's), whatever PATH was.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "analyze_run.ipynb"), as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=180,
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    import json
    steps = json.load(open(os.path.join(workdir, "summary.json")))["steps"]  # 2, or 3 once resumed
    assert f"{steps} learner steps" in text and "saved" in text
    assert os.path.getsize(os.path.join(workdir, "analysis.png")) > 10_000
    assert "versions checked" in text and ", passed" in text     # the parity gate's servers
    assert os.path.getsize(os.path.join(workdir, "parity.png")) > 10_000
