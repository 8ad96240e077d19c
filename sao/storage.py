"""One storage layer for run files: local paths and ``gs://`` alike.

The work dir (checkpoints, metrics, summary, TensorBoard), the publish dir
and ``model.init`` may be local paths or Google Cloud Storage URIs. Local
paths use the OS directly (atomic renames, appends, file modes); ``gs://``
goes through ``etils.epath`` (the path library orbax itself writes with; its
GCS backend is ``gcsfs``). Each operation here picks the right one, so the
callers (``sao.ckpt``, ``sao.run_metrics``, ``sao.train``,
``sao.models.from_pretrained``) never build a local ``gs:`` directory out of
a URI.

Object stores differ from a disk in three ways this module hides or states:
no atomic directory rename (`supports_rename` is False: ``sao.ckpt.publish``
writes a version in place and its ``LATEST`` marker, one object written
whole, is the commit), no append (`AppendLog` rewrites the object on each
flush; metric logs are small), and no local file for libraries that need
one (`local_copy` downloads a model once into a cache).

`check` runs at start-up (``sao.main``, ``sao.train``, the writers): a
``gs://`` path without ``gcsfs`` or without Google credentials fails there
with a message that says what to install or configure.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import uuid

from etils import epath

REMOTE_SCHEMES = ("gs",)
_CHECKED: set[str] = set()


class StorageError(RuntimeError):
    """A path this run cannot use (unsupported scheme, missing library or credentials)."""


def scheme(path: str) -> str:
    """``"gs"`` for ``gs://bucket/x``, ``""`` for a local path."""
    path = os.fspath(path)
    return path.split("://", 1)[0] if "://" in path else ""


def is_remote(path: str) -> bool:
    return scheme(path) != ""


def _gcs_requirements() -> None:
    """Raises StorageError unless gcsfs imports and Google credentials are found."""
    try:
        importlib.import_module("gcsfs")
    except ImportError as e:
        raise StorageError(
            "gs:// paths need the gcsfs package (GCS backend of etils.epath, the path "
            "library orbax uses): pip install 'sao[gcs]' (or pip install gcsfs)") from e
    try:
        auth = importlib.import_module("google.auth")
        auth.default()
    except Exception as e:   # DefaultCredentialsError, or google-auth missing
        raise StorageError(
            "gs:// paths need Google credentials: run `gcloud auth application-default "
            "login`, set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or "
            f"run on a Google Cloud VM with a service account ({type(e).__name__}: {e})") from e


def check(path: str, what: str = "path") -> None:
    """Fails early and clearly for a path this run cannot write or read.

    Local paths always pass. ``gs://`` needs ``gcsfs`` and Google
    credentials (checked once per process). Raises StorageError naming
    ``what`` (e.g. ``"--workdir"``) and the path.
    """
    kind = scheme(path)
    if not kind or kind in _CHECKED:
        return
    if kind not in REMOTE_SCHEMES:
        raise StorageError(f"{what} {path}: unsupported scheme {kind}://; use a local path "
                           f"or one of {', '.join(s + '://' for s in REMOTE_SCHEMES)}")
    try:
        _gcs_requirements()
    except StorageError as e:
        raise StorageError(f"{what} {path}: {e}") from e.__cause__
    _CHECKED.add(kind)


def abspath(path: str) -> str:
    """Absolute local path, or the URI unchanged."""
    return path if is_remote(path) else os.path.abspath(path)


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for local paths and URIs (no ``os.path`` mangling of ``gs://``)."""
    if not is_remote(root):
        return os.path.join(root, *parts)
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def basename(path: str) -> str:
    return os.path.basename(path.rstrip("/"))


def makedirs(path: str) -> None:
    if is_remote(path):
        epath.Path(path).mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(path, exist_ok=True)


def exists(path: str) -> bool:
    return epath.Path(path).exists() if is_remote(path) else os.path.exists(path)


def isfile(path: str) -> bool:
    return epath.Path(path).is_file() if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
    """Names in a directory (``[]`` if it does not exist)."""
    if is_remote(path):
        p = epath.Path(path)
        return sorted(c.name for c in p.iterdir()) if p.exists() else []
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def rmtree(path: str) -> None:
    """Removes a directory tree; nothing if it does not exist."""
    if is_remote(path):
        p = epath.Path(path)
        if p.exists():
            p.rmtree()
    else:
        shutil.rmtree(path, ignore_errors=True)


def supports_rename(path: str) -> bool:
    """True where renaming a directory is atomic (local file systems)."""
    return not is_remote(path)


def read_text(path: str) -> str:
    if is_remote(path):
        return epath.Path(path).read_text(encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    if is_remote(path):
        return epath.Path(path).read_bytes()
    with open(path, "rb") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Writes ``text`` so that a reader sees the old or the new content, never
    a part: a temporary file renamed over ``path`` (fsync'ed) locally, one
    object write on GCS (objects are replaced whole)."""
    if is_remote(path):
        epath.Path(path).write_text(text, encoding="utf-8")
        return
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class AppendLog:
    """An append-only file: a real append locally; on GCS (no appends) the
    content read at open plus everything written since, rewritten whole on
    each `flush` (metric logs stay small: KBs per step).

    Methods ``write(data)`` (str in text mode, bytes in binary), ``flush()``,
    ``close()``; a context manager.
    """

    def __init__(self, path: str, *, binary: bool = False):
        self.path, self.binary = path, binary
        self._remote = is_remote(path)
        if self._remote:
            p = epath.Path(path)
            self._data = bytearray(p.read_bytes() if p.exists() else b"")
            self._dirty = False
        else:
            self._file = open(path, "ab" if binary else "a", encoding=None if binary else "utf-8")

    def write(self, data) -> None:
        if not self._remote:
            self._file.write(data)
            return
        self._data += data if self.binary else data.encode("utf-8")
        self._dirty = True

    def flush(self) -> None:
        if not self._remote:
            self._file.flush()
        elif self._dirty:
            epath.Path(self.path).write_bytes(bytes(self._data))
            self._dirty = False

    def close(self) -> None:
        self.flush()
        if not self._remote:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _TensorBoardFactory:
    """tensorboardX writer factory: event files on GCS through `AppendLog`
    (replaces its own ``google-cloud-storage`` writer: one storage layer)."""

    def open(self, path: str) -> AppendLog:
        return AppendLog(path, binary=True)

    def directory_check(self, path: str) -> None:
        makedirs(path)


def tensorboard_writer(logdir: str):
    """A ``tensorboardX.SummaryWriter`` on ``logdir``, a local or remote path (event
    files on GCS through `AppendLog`). tensorboardX is imported here, not with this
    module: it imports torch when torch is installed (~2 s and ~0.3 GB per process),
    which workers and launchers never need."""
    from tensorboardX import SummaryWriter, record_writer
    for kind in REMOTE_SCHEMES:
        record_writer.register_writer_factory(kind, _TensorBoardFactory())
    return SummaryWriter(logdir)


def default_cache_dir() -> str:
    """``$SAO_CACHE_DIR``, else ``~/.cache/sao``: where `local_copy` downloads."""
    return os.environ.get("SAO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sao")


def local_copy(path: str, cache_dir: str | None = None) -> str:
    """A local path with the content of ``path`` (a file or a directory tree).

    Local paths are returned unchanged. A URI is downloaded once into
    ``<cache_dir>/remote/<hash of the URI>/<name>``; a ``.complete`` marker
    written last makes an interrupted download start over, and a finished one
    is reused. Raises FileNotFoundError if the URI does not exist.
    """
    if not is_remote(path):
        return path
    check(path, "model path")
    root = os.path.join(cache_dir or default_cache_dir(), "remote",
                        hashlib.sha256(path.encode()).hexdigest()[:16])
    dest = os.path.join(root, basename(path))
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return dest
    src = epath.Path(path)
    if not src.exists():
        raise FileNotFoundError(f"{path} does not exist")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    files = [src] if not src.is_dir() else [
        epath.Path(d) / f for d, _, names in src.walk() for f in names]
    for item in files:
        rel = os.fspath(item)[len(os.fspath(src)):].lstrip("/")
        target = os.path.join(dest, rel) if rel else dest
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with item.open("rb") as r, open(target, "wb") as w:
            shutil.copyfileobj(r, w, 1 << 24)
    with open(marker, "w", encoding="utf-8") as f:
        f.write(path)
    return dest
