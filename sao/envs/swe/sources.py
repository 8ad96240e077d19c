"""The source tier's packages: PyPI sdists that ship their tests, pinned.

``fetch_sdist`` gets ``NAME==VERSION`` with ``pip download --no-deps
--no-binary :all:`` into a content-addressed cache
(``<cache>/sdists/<sha256>.tar.gz``, cache default ``~/.cache/sao/swe``,
``SAO_CACHE_DIR`` overrides ``~/.cache/sao``) and checks the sha256 pinned
here, so a build is reproducible and offline once cached. A missing cache
without network raises ``SourceUnavailableError`` saying what to run.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile

from sao.envs.swe.files import Files, from_tar


class SourceUnavailableError(RuntimeError):
    """An sdist is neither cached nor downloadable (or its hash is wrong)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One pinned sdist and how its tests run.

    Attributes:
      name, version: the PyPI project and release.
      sha256: hex digest of the sdist archive.
      src_dirs: directories (or single files) of the package's code, where
        bugs are injected (test files inside them are skipped).
      pythonpath: ``PYTHONPATH`` of the test run (relative to the root).
      pytest_args: extra pytest arguments (e.g. ``-o addopts=`` to drop
        coverage flags, ``--ignore`` for slow CLI tests).
    """

    name: str
    version: str
    sha256: str
    src_dirs: tuple[str, ...]
    pythonpath: str = "."
    pytest_args: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


# Measured on a 2-core machine (docs/envs.md): each suite runs in 1-3 s
# with pytest and only the source on the path.
SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("inflection", "0.5.1",
           "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
           ("inflection",)),
    Source("parse", "1.22.4",
           "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5",
           ("parse",)),
    Source("cachetools", "8.0.2",
           "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0",
           ("src/cachetools",), pythonpath="src"),
    Source("tabulate", "0.10.0",
           "e2cfde8f79420f6deeffdeda9aaec3b6bc5abce947655d17ac662b126e48a60d",
           ("tabulate",), pytest_args=("--ignore=test/test_cli.py", "--ignore=benchmark")),
    Source("toolz", "1.2.0",
           "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490",
           ("toolz",), pytest_args=("--ignore=tlz",)),
)}

# Left out of a task's repository: packaging metadata and docs.
_SKIP_PREFIXES = ("docs/", ".github/", "benchmark/")


def cache_root() -> pathlib.Path:
    """``$SAO_CACHE_DIR/swe`` or ``~/.cache/sao/swe``."""
    base = os.environ.get("SAO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sao")
    return pathlib.Path(base) / "swe"


def fetch_sdist(source: Source, *, cache: pathlib.Path | None = None,
                download: bool = True) -> pathlib.Path:
    """Path of the cached sdist of ``source``, downloading it if needed.

    Raises SourceUnavailableError if it is not cached and ``download`` is
    False or pip cannot get it (no network), or if the archive's sha256 is
    not the pinned one.
    """
    cache = cache or cache_root()
    target = cache / "sdists" / f"{source.sha256}.tar.gz"
    if target.exists():
        return target
    hint = (f"the sdist {source.key} is not in {target.parent}; with network run "
            f"`pip download --no-deps --no-binary :all: {source.name}=={source.version}` "
            f"and copy it to {target}")
    if not download:
        raise SourceUnavailableError(hint)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "-q", "-d", tmp, f"{source.name}=={source.version}"],
            capture_output=True, text=True, timeout=600, check=False)
        got = sorted(pathlib.Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or len(got) != 1:
            raise SourceUnavailableError(f"{hint}\npip said: {proc.stderr.strip()[-800:]}")
        digest = hashlib.sha256(got[0].read_bytes()).hexdigest()
        if digest != source.sha256:
            raise SourceUnavailableError(
                f"{source.key}: downloaded sdist has sha256 {digest}, pinned {source.sha256}")
        os.replace(got[0], target)
    return target


@functools.lru_cache(maxsize=16)
def _load(sha256: str, path: str) -> tuple[tuple[str, bytes], ...]:
    data = pathlib.Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SourceUnavailableError(f"cached sdist {path} does not match its sha256")
    files = from_tar(data, strip=1, skip=_SKIP_PREFIXES)
    files = {p: d for p, d in files.items()
             if ".egg-info/" not in p and p not in ("PKG-INFO",)}
    return tuple(sorted(files.items()))


def load_source(source: Source, *, cache: pathlib.Path | None = None,
                download: bool = True) -> Files:
    """The sdist's files (top directory stripped; egg-info, docs left out)."""
    path = fetch_sdist(source, cache=cache, download=download)
    return dict(_load(source.sha256, str(path)))
