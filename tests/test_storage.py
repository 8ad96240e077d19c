"""sao.storage on local paths and on a fake gs:// file system (etils' epath mock),
and the start-up failure of gs:// without gcsfs or credentials."""
import json
import os
import sys
import types

import numpy as np
import pytest
from etils import epath
from etils.epath import testing as epath_testing
from flax import nnx

from sao import ckpt, run_metrics, storage
from sao.models import Transformer, get_preset, save_pretrained
from sao.models.pretrained import from_pretrained


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
    """gs://<bucket>/<key> served from tmp_path/bucket/<key> through epath's
    own test hook (every epath backend replaced); the library and credential
    check passes. Yields the local root."""
    root = tmp_path / "gcs"
    root.mkdir()

    def local(path):
        path = os.fspath(path)
        return str(root / path[len("gs://"):]) if path.startswith("gs://") else path

    def redirect(original, path, *args, **kwargs):
        return original(local(path), *args, **kwargs)

    def redirect2(original, path, dst, *args, **kwargs):
        return original(local(path), local(dst), *args, **kwargs)

    def listdir(original, path):
        return original(local(path))

    def walk(original, top, **kwargs):
        for dirpath, dirs, files in original(local(top), **kwargs):
            yield "gs://" + os.path.relpath(dirpath, root), dirs, files

    def glob(original, pattern):
        return ["gs://" + os.path.relpath(p, root) for p in original(local(pattern))]

    monkeypatch.setattr(storage, "_gcs_requirements", lambda: None)
    monkeypatch.setattr(storage, "_CHECKED", set())
    fns = dict(open=redirect, exists=redirect, isdir=redirect, makedirs=redirect, mkdir=redirect,
               rmtree=redirect, remove=redirect, stat=redirect, listdir=listdir, walk=walk,
               glob=glob, rename=redirect2, replace=redirect2, copy=redirect2)
    with epath_testing.mock_epath(**fns):
        yield root


def test_local_paths(tmp_path):
    d = str(tmp_path / "a")
    storage.makedirs(storage.join(d, "b"))
    assert storage.listdir(d) == ["b"] and storage.listdir(str(tmp_path / "none")) == []
    p = storage.join(d, "x.json")
    storage.write_text(p, "one")
    storage.write_text(p, "two")
    assert storage.read_text(p) == "two" and storage.isfile(p)
    assert sorted(os.listdir(d)) == ["b", "x.json"]        # no temporaries left
    with storage.AppendLog(storage.join(d, "log")) as log:
        log.write("a\n")
    with storage.AppendLog(storage.join(d, "log")) as log:
        log.write("b\n")
    assert storage.read_text(storage.join(d, "log")) == "a\nb\n"
    assert storage.local_copy(d) == d and storage.abspath("rel") == os.path.abspath("rel")
    assert storage.supports_rename(d) and not storage.supports_rename("gs://b/x")
    storage.rmtree(d)
    assert not storage.exists(d)
    storage.rmtree(d)                                          # absent: nothing to do


def test_join_keeps_uris():
    assert storage.join("gs://bucket/run/", "ckpt", "/x") == "gs://bucket/run/ckpt/x"
    assert storage.abspath("gs://bucket/run") == "gs://bucket/run"
    assert storage.scheme("gs://b") == "gs" and storage.scheme("/tmp/x") == ""


def test_gs_without_gcsfs_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(storage, "_CHECKED", set())
    monkeypatch.setitem(sys.modules, "gcsfs", None)            # import fails
    with pytest.raises(storage.StorageError, match=r"work dir gs://bucket/run: .*gcsfs.*sao\[gcs\]"):
        run_metrics.MetricsWriter("gs://bucket/run")
    with pytest.raises(storage.StorageError, match="checkpoint dir gs://bucket/run/ckpt"):
        ckpt.Checkpointer("gs://bucket/run/ckpt")
    with pytest.raises(storage.StorageError, match="model path gs://bucket/model"):
        from_pretrained("gs://bucket/model")
    with pytest.raises(storage.StorageError, match="unsupported scheme s3://"):
        storage.check("s3://bucket/x", "work dir")
    assert os.listdir(tmp_path) == []                           # never a local gs: directory


def test_gs_without_credentials_fails_clearly(monkeypatch):
    monkeypatch.setattr(storage, "_CHECKED", set())
    monkeypatch.setitem(sys.modules, "gcsfs", types.ModuleType("gcsfs"))

    def default():
        raise RuntimeError("Your default credentials were not found")
    google = types.ModuleType("google")
    auth = types.ModuleType("google.auth")
    auth.default = default
    google.auth = auth
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.auth", auth)
    with pytest.raises(storage.StorageError,
                       match=r"publish dir gs://b/p: .*credentials.*GOOGLE_APPLICATION_CREDENTIALS"):
        storage.check("gs://b/p", "publish dir")


def test_metrics_and_json_on_fake_gcs(fake_gcs, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with run_metrics.MetricsWriter("gs://bucket/run", tensorboard=True) as w:
        w.write(1, {"actor/loss": 0.5})
    with run_metrics.MetricsWriter("gs://bucket/run", tensorboard=False) as w:   # resume appends
        w.write(2, {"actor/loss": 0.25, "batch/staleness_counts": [3, 1]})
    records = run_metrics.read_metrics("gs://bucket/run")
    assert [r["step"] for r in records] == [1, 2] and records[1]["actor/loss"] == 0.25
    assert (fake_gcs / "bucket/run/metrics.jsonl").exists()
    assert any(n.startswith("events") for n in os.listdir(fake_gcs / "bucket/run/tb"))
    run_metrics.write_json("gs://bucket/run/summary.json", {"x": np.float32(1.5)})
    assert json.loads((fake_gcs / "bucket/run/summary.json").read_text()) == {"x": 1.5}
    assert not os.path.exists(tmp_path / "gs:")


def test_publish_marker_and_model_copy_on_fake_gcs(fake_gcs, tmp_path, monkeypatch):
    """The publish dir's marker, pruning and version layout through the storage
    layer (orbax's own array writes to gs:// go through tensorstore, which the
    fake cannot serve: ``ckpt.publish`` is checked end to end locally in
    tests/test_ckpt.py); a gs:// model is copied once into the cache."""
    monkeypatch.setattr(ckpt, "_write_params", lambda path, params: _FakeCheckpointer().save(path, params))
    root = "gs://bucket/run/publish"
    uris = [ckpt.publish(root, v, {"w": np.arange(3)}, keep=2) for v in (1, 2, 3)]
    assert ckpt.latest_published(root) == (3, uris[-1])
    assert uris[-1] == "gs://bucket/run/publish/v0000000003/params"
    assert storage.listdir(root) == ["LATEST", "v0000000002", "v0000000003"]
    assert ckpt.hf_dir(uris[-1]) == "gs://bucket/run/publish/v0000000003/hf"
    with pytest.raises(ValueError, match="not newer"):
        ckpt.publish(root, 3, {"w": np.arange(3)})

    cfg = get_preset("tiny", num_layers=1)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    save_pretrained(model, cfg, str(fake_gcs / "bucket/models/tiny"))
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("SAO_CACHE_DIR", cache)
    local = storage.local_copy("gs://bucket/models/tiny")
    assert local.startswith(cache) and sorted(os.listdir(local)) == ["config.json",
                                                                     "model.safetensors"]
    _, loaded, _ = from_pretrained("gs://bucket/models/tiny")
    np.testing.assert_array_equal(loaded.embed.embedding[...], model.embed.embedding[...])
    os.remove(os.path.join(local, "config.json"))                # a finished copy is reused
    assert storage.local_copy("gs://bucket/models/tiny") == local


class _FakeCheckpointer:
    """Stands in for orbax's writer (tensorstore does not go through epath):
    one file per publish, written through the storage layer."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def save(self, path, params):
        storage.makedirs(path)
        epath.Path(storage.join(path, "params.json")).write_text(
            json.dumps({k: np.asarray(v).tolist() for k, v in params.items()}))
