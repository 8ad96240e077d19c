"""notebooks/trajectory_viewer.ipynb executes (nbclient, the venv's python3 kernel) on a tiny run:
it reads the run's config.json, restores its checkpoints, samples episodes, and renders the
coloured token views."""
import json
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TESTS)
from test_main_support import ROOT, tiny_run  # noqa: E402
from xla_flags import cpu_devices  # noqa: E402


@pytest.mark.slow
def test_trajectory_viewer_runs_on_a_tiny_run(monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    workdir, proc = tiny_run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("SAO_RUN_DIR", workdir)
    monkeypatch.delenv("SAO_CONFIG", raising=False)            # the run's config.json, flags and all
    monkeypatch.delenv("SAO_CONFIG_ARGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", cpu_devices(1))  # as the run
    # The kernel spec runs "python": make it this interpreter (the venv's), whatever PATH was.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "trajectory_viewer.ipynb"), as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    steps = json.load(open(os.path.join(workdir, "summary.json")))["steps"]  # 2, or 3 once resumed
    assert f"config: {workdir}/config.json (quickstart)" in text
    assert f"scoring with step {steps}" in text and "sampling with step" in text
    assert "8 sampled" in text
    assert any("DIS low" in h and "max |A|" in h for h in html)              # the summary table
    views = [h for h in html if 'class="sao-token-view"' in h]
    assert len(views) >= 8 and len(views) % 4 == 0                           # 4 quantities per pick
    for quantity in ("advantages", "values", "ratio", "policy_version"):
        assert sum(f"coloured by {quantity}" in v for v in views) == len(views) // 4
    assert all('class="tok action' in v and 'class="legend"' in v for v in views)
    saved = open(os.path.join(workdir, "trajectory_views.html"), encoding="utf-8").read()
    assert saved.count('class="sao-token-view"') == len(views)
