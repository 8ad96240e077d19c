"""Checkpoints (orbax) and publishing weights to the rollout fleet.

Two kinds of checkpoint live in two directories:

* **Training checkpoints** (`Checkpointer`, an ``orbax.checkpoint``
  ``CheckpointManager``): the learner's state pytree (``sao.learner``
  ``LearnerStates``: actor and critic parameters, optimiser states, update
  counters, reference parameters, learner step), and one JSON item with the learner step, policy
  version, RNG key data, the prompt iterator's state (grain's JSON state) and
  the scalar fields of any buffered-but-untrained trajectories, whose arrays
  are a third item (concatenated numpy arrays plus offsets). Saves are async
  and keep the newest ``max_to_keep``. Orbax writes each step into a temporary
  directory and renames it when complete, so a process killed mid-save leaves
  only complete steps visible to `Checkpointer.latest_step`. Restore takes
  abstract targets carrying shardings (`abstract_state`), so it can land on a
  different mesh than the one that saved.
* **Publish checkpoints** (`publish`, `latest_published`): parameters only, as
  the ``nnx.State`` of the model's ``nnx.Param`` (what
  ``sao.rollout.JaxEngine.load_weights`` reads with
  ``ocp.StandardCheckpointer``) in ``v{version}/params``, optionally plus an
  HF export (safetensors, ``config.json``, tokenizer files: what an SGLang
  server loads) in ``v{version}/hf``. Both are written into one temporary
  directory, which is renamed to ``v{version}`` only when both are complete;
  only then is the ``LATEST`` marker replaced atomically (``os.replace``). A
  reader never sees a version directory with half its files, and one that
  goes through `latest_published` never sees a version before it is marked.
  File modes follow the umask (safetensors writes ``0600``), so servers
  running as another user can read what the umask lets them.

Resume order: see docs/learner.md.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from sao import multihost, storage
from sao.types import Trajectory

LATEST_MARKER = "LATEST"
PARAMS_DIR = "params"  # orbax params checkpoint inside a version directory
HF_DIR = "hf"          # HF export inside a version directory
_BUFFER_ARRAYS = ("tokens", "action_mask", "rollout_logprobs", "policy_version")


def abstract_state(tree, shardings=None):
    """``jax.ShapeDtypeStruct`` for each leaf, with ``shardings`` (a matching
    tree, e.g. ``Learner.state_shardings``) or the leaves' own sharding:
    the restore target. Use shardings of another mesh to reshard on restore."""
    if shardings is None:
        return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _buffer_to_items(buffer: list[Trajectory]) -> tuple[dict[str, np.ndarray], list[dict]]:
    lengths = [t.length for t in buffer]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    arrays = {}
    for name in _BUFFER_ARRAYS:
        parts = [np.asarray(getattr(t, name)) for t in buffer]
        dtype = {"tokens": np.int32, "action_mask": np.int8,
                 "rollout_logprobs": np.float32, "policy_version": np.int32}[name]
        flat = np.concatenate(parts).astype(dtype) if parts else np.zeros((0,), dtype)
        # One trailing element: orbax does not store zero-size arrays.
        arrays[name] = np.concatenate([flat, np.zeros((1,), dtype)])
    arrays["offsets"] = offsets
    scalars = [dict(reward=t.reward, finish=t.finish, prompt_id=t.prompt_id,
                    trajectory_id=t.trajectory_id, metadata=t.metadata, timings=t.timings)
               for t in buffer]
    return arrays, scalars


def _buffer_from_items(arrays: dict[str, np.ndarray], scalars: list[dict]) -> list[Trajectory]:
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    off = arrays["offsets"]
    out = []
    for i, s in enumerate(scalars):
        a, b = int(off[i]), int(off[i + 1])
        out.append(Trajectory(tokens=arrays["tokens"][a:b],
                              action_mask=arrays["action_mask"][a:b].astype(bool),
                              rollout_logprobs=arrays["rollout_logprobs"][a:b],
                              policy_version=arrays["policy_version"][a:b], **s))
    return out


def _encode_data_state(state: Any) -> Any:
    if isinstance(state, bytes):
        return {"__bytes__": base64.b64encode(state).decode("ascii")}
    return state


def _decode_data_state(state: Any) -> Any:
    if isinstance(state, dict) and set(state) == {"__bytes__"}:
        return base64.b64decode(state["__bytes__"])
    return state


@dataclasses.dataclass
class Restored:
    """What `Checkpointer.restore` returns (see `Checkpointer.save`)."""

    step: int
    train_state: Any
    rng: np.ndarray | None
    policy_version: int
    data_state: Any
    buffer: list[Trajectory]
    extra: dict


class Checkpointer:
    """Training checkpoints in ``directory`` (one orbax step per learner step).

    Args:
      directory: created if missing.
      max_to_keep: newest complete steps kept.
      async_save: save in a background thread (call `wait` before reading).
    """

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        storage.check(directory, "checkpoint dir")
        self.directory = storage.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, *, train_state, rng=None, policy_version: int = 0,
             data_state: Any = None, buffer: list[Trajectory] = (),
             extra: dict | None = None, force: bool = False) -> bool:
        """Starts saving ``step`` (returns once arrays are copied off device).

        Args:
          step: learner step (the orbax step number).
          train_state: the learner's state pytree (e.g. ``LearnerStates``).
          rng: a JAX PRNG key (typed or raw uint32) or None.
          policy_version: version of the actor parameters.
          data_state: prompt iterator state: JSON-serialisable or bytes.
          buffer: trajectories received but not trained on yet.
          extra: any other JSON-serialisable facts.
        Returns:
          True if a save was started.
        Raises:
          ValueError: ``data_state`` / ``extra`` not JSON-serialisable.
        """
        rng_data = None
        if rng is not None:
            key = rng
            if jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
                key = jax.random.key_data(key)
            rng_data = np.asarray(jax.device_get(key)).astype(np.uint32)
        arrays, scalars = _buffer_to_items(list(buffer))
        meta = {"step": int(step), "policy_version": int(policy_version),
                "rng": None if rng_data is None else rng_data.tolist(),
                "data_state": _encode_data_state(data_state), "buffer": scalars,
                "extra": extra or {}}
        try:
            json.dumps(meta)
        except TypeError as e:
            raise ValueError(f"checkpoint metadata is not JSON-serialisable: {e}") from e
        items = {"train": ocp.args.StandardSave(train_state), "meta": ocp.args.JsonSave(meta),
                 "buffer": ocp.args.StandardSave(arrays)}
        return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

    def wait(self) -> None:
        """Blocks until pending async saves are complete on disk."""
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """Newest complete step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, step: int | None = None, *, target) -> Restored:
        """Restores ``step`` (default: the latest complete one).

        Args:
          target: abstract state tree (`abstract_state`, or
            ``Learner.abstract_states()``) whose shardings decide the placement;
            its structure must match the saved one.
        Raises:
          FileNotFoundError: no complete checkpoint.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        meta = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        out = self._manager.restore(step, args=ocp.args.Composite(
            train=ocp.args.StandardRestore(target), buffer=ocp.args.StandardRestore()))
        rng = None if meta["rng"] is None else np.asarray(meta["rng"], np.uint32)
        return Restored(step=int(meta["step"]), train_state=out["train"], rng=rng, policy_version=int(meta["policy_version"]),
                        data_state=_decode_data_state(meta["data_state"]),
                        buffer=_buffer_from_items(out["buffer"], meta["buffer"]),
                        extra=meta["extra"])

    def close(self) -> None:
        """Waits for pending saves and releases the manager."""
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------
# Publishing parameters for the fleet.


def _version_dir(directory: str, version: int) -> str:
    return storage.join(directory, f"v{int(version):010d}")


def publish(directory: str, version: int, params, *, hf_export=None, keep: int = 3) -> str:
    """Writes a params-only checkpoint of ``version`` and marks it latest.

    Args:
      directory: publish root (created), local or ``gs://`` (``sao.storage``).
      version: policy version (must be newer than the current latest).
      params: ``nnx.State`` of the model's ``nnx.Param`` (e.g.
        ``nnx.state(model, nnx.Param)`` or ``ModelDef.param_state(params)``).
      hf_export: optional ``callable(path)`` writing an HF export into the
        directory ``path`` (e.g. ``lambda p: sao.models.save_pretrained(params,
        cfg, p, tokenizer)``; ``save_pretrained`` takes the ``nnx.State``
        too); it must write ``config.json``. It lands in ``<version dir>/hf``,
        renamed into place together with the params.
      keep: published versions kept (older ones are deleted after the marker
        moves; readers should load within ``keep`` publishes).
    Returns:
      The uri (directory) of the orbax params checkpoint, ``<version dir>/params``.
    Raises:
      ValueError: ``version`` is not newer than the latest published one.
      RuntimeError: ``hf_export`` wrote no ``config.json``. Whatever
        ``hf_export`` raises propagates. On any error nothing is published
        and the temporary directory is removed.

    Several processes (a multi-host learner) call it together: each writes
    the shards of ``params`` it holds (orbax saves collectively) into the same
    directory, named by the version; process 0 alone runs ``hf_export`` (so it
    must not need other processes' arrays), renames, moves the marker and
    prunes, and all return once the version is marked. On ``gs://``, where a
    directory cannot be renamed atomically, the version is written in place
    and the ``LATEST`` marker (one object, replaced whole) is the commit.
    """
    storage.check(directory, "publish dir")
    directory = storage.abspath(directory)
    lead = multihost.is_lead()
    latest = latest_published(directory)
    if latest is not None and version <= latest[0]:
        raise ValueError(f"version {version} is not newer than published {latest[0]}")
    atomic = storage.supports_rename(directory)
    final = _version_dir(directory, version)
    # One name per version: every process of a multi-host learner writes into it.
    target = storage.join(directory, f".tmp-{int(version)}-partial") if atomic else final
    dir_mode = None
    if lead:
        storage.makedirs(directory)
        storage.rmtree(target)          # left by a publish killed before its marker moved
        storage.makedirs(target)
        if atomic:
            dir_mode = stat.S_IMODE(os.stat(target).st_mode)  # 0o777 less the umask
    multihost.sync(f"sao-publish-{int(version)}-begin")
    try:
        _write_params(storage.join(target, PARAMS_DIR), params)
        if lead and hf_export is not None:
            hf_path = storage.join(target, HF_DIR)
            hf_export(hf_path)
            if not storage.isfile(storage.join(hf_path, "config.json")):
                raise RuntimeError(f"hf_export wrote no config.json into {hf_path}")
        if dir_mode is not None:
            _umask_modes(target, dir_mode)
    except BaseException:
        if lead:
            storage.rmtree(target)
        raise
    if lead:
        if atomic:
            # Left by a publish killed between its rename and its marker: never
            # marked, so no reader was told of it.
            storage.rmtree(final)
            os.rename(target, final)
        storage.write_text(storage.join(directory, LATEST_MARKER),
                           json.dumps({"version": int(version), "path": storage.basename(final)}))
        _prune(directory, keep)
    multihost.sync(f"sao-publish-{int(version)}-end")
    return storage.join(final, PARAMS_DIR)


def _write_params(path: str, params) -> None:
    """The orbax checkpoint of a publish (``ocp.StandardCheckpointer`` restores it),
    uncompressed: weights barely compress (~8%), and zstd made saving and restoring
    them 3-4x slower (benchmarks/README.md, weight push). Collective across processes."""
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_compression=False)) as ckptr:
        ckptr.save(path, args=ocp.args.PyTreeSave(params))


def _umask_modes(root: str, dir_mode: int) -> None:
    """Sets every directory under ``root`` to ``dir_mode`` (what ``mkdir``
    gave ``root``: ``0o777`` less the umask) and every file to ``dir_mode &
    0o666``, the modes a plain ``mkdir``/``open`` gives. Writers that use
    ``0600`` temporaries (safetensors) would otherwise make the export
    unreadable to a server running as another user."""
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, dir_mode)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, dir_mode & 0o666)


def _prune(directory: str, keep: int) -> None:
    names = storage.listdir(directory)
    versions = sorted(d for d in names if d.startswith("v") and d[1:].isdigit())
    for d in versions[:-keep] if keep > 0 else []:
        storage.rmtree(storage.join(directory, d))
    # Temporaries left by a crashed publish (publishes are serial per learner).
    for d in names:
        if d.startswith(".tmp-"):
            storage.rmtree(storage.join(directory, d))


def latest_published(directory: str) -> tuple[int, str] | None:
    """``(version, uri)`` of the newest complete publish, or None if none.

    ``uri`` is the orbax params directory to pass to ``Engine.load_weights``;
    ``<uri>/../hf`` holds the HF export when one was requested (`hf_dir`).
    """
    try:
        marker = json.loads(storage.read_text(storage.join(directory, LATEST_MARKER)))
    except FileNotFoundError:
        return None
    path = storage.join(storage.abspath(directory), marker["path"], PARAMS_DIR)
    return int(marker["version"]), path


def hf_dir(uri: str) -> str:
    """The HF export directory of a `publish` uri (``<version dir>/hf``)."""
    return storage.join(uri.rstrip("/").rsplit("/", 1)[0], HF_DIR)
