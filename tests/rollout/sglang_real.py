"""The real SGLang server (PyTorch, CPU engine) for tests: where `make
sglang-real-venv` installs it and how to start it on a model directory.

The environment lives outside the clone, once per machine:
``$SGLANG_REAL_VENV`` or ``~/.cache/sao/sglang-0.5.23`` (the Makefile's
default); a test skips while its ``.installed`` stamp is missing. The server
imports ``sgl_kernel``, whose registry wheel is a CUDA build; the package's
stand-in (``sao/rollout/sgl_kernel_cpu``; its docstring says what it replaces
and why) shadows it.
"""
import os
import pathlib

import pytest

from sao.rollout.sglang_server import SGL_KERNEL_CPU_PATH, TORCH_CPU_ARGS, SGLangServer

VERSION = "0.5.23"
VENV = pathlib.Path(os.environ.get("SGLANG_REAL_VENV")
                    or pathlib.Path.home() / ".cache" / "sao" / f"sglang-{VERSION}")
PYTHON = VENV / "bin" / "python"
STANDIN = pathlib.Path(SGL_KERNEL_CPU_PATH)

needs_real_sglang = pytest.mark.skipif(
    not (VENV / ".installed").exists(),
    reason=f"no SGLang {VERSION} environment at {VENV} (run `make sglang-real-venv`)")


def real_server(model_path: str, **kwargs) -> SGLangServer:
    """An `SGLangServer` running ``sglang.launch_server`` on CPU (not started)."""
    return SGLangServer(model_path, python=str(PYTHON), module="sglang.launch_server",
                        args=TORCH_CPU_ARGS, python_path=[STANDIN], **kwargs)
