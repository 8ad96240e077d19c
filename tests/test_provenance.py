"""sao.provenance: one record per start of a run, naming the code that ran."""
import json
import os
import subprocess

from sao import provenance

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_each_start_appends_a_record_naming_the_checkout(tmp_path):
    first = provenance.record_start(str(tmp_path))
    second = provenance.record_start(str(tmp_path))
    lines = (tmp_path / provenance.RUN_INFO_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [first, second]
    assert provenance.read_run_info(str(tmp_path)) == [first, second]
    assert first["commit"] == _git("rev-parse", "HEAD")
    assert first["code_version"] == _git("describe", "--always", "--dirty")
    assert first["jax"] and first["python"] and isinstance(first["argv"], list)


def test_without_git_the_version_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_git", lambda *args: None)
    info = provenance.record_start(str(tmp_path))
    assert info["code_version"] == "unknown" and info["commit"] is None


def test_a_run_without_records_reads_empty(tmp_path):
    assert provenance.read_run_info(str(tmp_path)) == []
