"""Regenerates the checked-in gRPC stubs from ``sao/rpc/sao.proto``.

Run from the repository root after editing the proto::

    .venv/bin/python -m sao.rpc.gen

It writes ``sao/rpc/sao_pb2.py``, ``sao_pb2.pyi`` and ``sao_pb2_grpc.py`` with
grpcio-tools' bundled ``protoc``. ``tests/rpc/test_stubs.py`` compiles the proto
again and fails when the checked-in stubs no longer match it.
"""
from __future__ import annotations

import pathlib
import sys

from grpc_tools import protoc

RPC_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = RPC_DIR.parent.parent
PROTO = "sao/rpc/sao.proto"


def _protoc(*args: str) -> None:
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["grpc_tools.protoc", f"-I{REPO_ROOT}", f"-I{include}", *args,
                      str(REPO_ROOT / PROTO)])
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")


def generate(out_dir: pathlib.Path | str = REPO_ROOT) -> None:
    """Writes the stubs under ``out_dir/sao/rpc/`` (the repository by default)."""
    out = str(out_dir)
    _protoc(f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}")


def descriptor_set(path: pathlib.Path | str) -> None:
    """Writes the proto's serialized ``FileDescriptorSet`` to ``path``."""
    _protoc(f"--descriptor_set_out={path}")


if __name__ == "__main__":
    generate()
    sys.exit(0)
