"""What the learner published: the publish manifest as a worker reads it.

``sao.ckpt.publish`` writes each version into ``<root>/v<version:010d>/``
(the orbax params in ``params/``, an HF export in ``hf/``) and then moves the
``LATEST`` marker (``{"version", "path"}``) to it; older versions are pruned
to the last ``keep``. A worker with a ``publish_root`` loads a version only
when the manifest holds it (``unpublished_error``): the version is at most
the marker's, its directory exists, and the uri is that directory's
``params`` (version and location come together). So a caller holding the
token cannot move a worker to a version the learner never published, nor
label old weights with a new version. Local paths (and ``file://``) only;
nothing here imports JAX (the names match ``sao.ckpt``'s, checked by a test).
"""
from __future__ import annotations

import json
import os

LATEST_MARKER = "LATEST"
PARAMS_DIR = "params"


def version_dir(root: str, version: int) -> str:
    """``<root>/v<version:010d>``: where ``sao.ckpt.publish`` writes ``version``."""
    return os.path.join(root, f"v{int(version):010d}")


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def latest_version(root: str) -> int | None:
    """The manifest's latest published version, or None (no or unreadable marker)."""
    try:
        with open(os.path.join(_local(root), LATEST_MARKER)) as f:
            marker = json.load(f)
        version = marker["version"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return version if type(version) is int else None


def unpublished_error(version: int, uri: str, root: str) -> str | None:
    """Why ``(version, uri)`` is not a publish the manifest under ``root``
    holds, or None. Never raises."""
    root = _local(root)
    latest = latest_version(root)
    if latest is None:
        return f"no publish manifest ({LATEST_MARKER}) under {root}"
    if version > latest:
        return f"version {version} is not published (the manifest's latest is {latest})"
    expected = os.path.join(version_dir(root, version), PARAMS_DIR)
    if os.path.realpath(_local(uri)) != os.path.realpath(expected):
        return f"uri {uri!r} is not where version {version} is published ({expected})"
    if not os.path.isdir(expected):
        return f"version {version} is no longer published under {root}"
    return None
