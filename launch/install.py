"""What the launchers run on a fresh machine to install SAO: a Python, the venv, JAX for the platform.

Each is one shell command (bash), run from the SAO checkout:

* :func:`pick_python` sets ``$PY`` to an interpreter setup.py accepts
  (3.11 or 3.12) that the image has (``python3.12``, ``python3.11``,
  ``python3``), else installs Python 3.11 with uv (astral.sh) and uses it;
* :func:`install_sao` creates ``.venv`` with it (once) and installs SAO with the
  platform's JAX: ``jax[cuda12]`` on GPU nodes, ``jax[tpu]`` and the ``gcs``
  extra (``gs://`` work dirs) on TPU hosts, at the version range setup.py
  pins, so that the learner finds its accelerators;
* :func:`install_sglang` installs the SGLang server once per machine
  (``make sglang-real-venv``, outside the checkout, with ``$PY``).
"""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLATFORM_EXTRAS = {"gpu": ("", "cuda12"), "tpu": ("gcs", "tpu"), "cpu": ("", "")}


def jax_range() -> str:
    """setup.py's jax requirement's version range, e.g. ``>=0.10.2,<0.11``."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        m = re.search(r'"jax(>=[^"]+)"', f.read())
    if not m:
        raise ValueError("setup.py pins no jax version")
    return m.group(1)


def pick_python() -> str:
    """Sets ``PY`` (bash): an image Python 3.11-3.12, else one uv installs (exits if none)."""
    ok = "import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))"
    return ('{ PY=""; for p in python3.12 python3.11 python3; do '
            f'if command -v "$p" >/dev/null && "$p" -c "{ok}" 2>/dev/null; then PY=$(command -v "$p"); break; fi; '
            'done; if [ -z "$PY" ]; then echo "no Python 3.11/3.12 here: installing one with uv" >&2; '
            '{ command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh; } && '
            'UV=$(command -v uv || echo "$HOME/.local/bin/uv") && "$UV" python install 3.11 && '
            'PY=$("$UV" python find 3.11); fi; [ -n "$PY" ] || { echo "no usable Python" >&2; exit 1; }; }')


def install_sao(platform: str) -> str:
    """``.venv`` (made with ``$PY`` unless present) with SAO and the platform's JAX (bash, after
    :func:`pick_python`). Raises KeyError for a platform other than gpu, tpu, cpu."""
    extra, jax_extra = PLATFORM_EXTRAS[platform]
    sao = "." + (f"[{extra}]" if extra else "")
    jax = f"jax[{jax_extra}]{jax_range()}" if jax_extra else ""
    return (f'{{ [ -x .venv/bin/python ] || "$PY" -m venv .venv; }} && .venv/bin/pip install -q -U pip && '
            f".venv/bin/pip install -q -e '{sao}'" + (f" '{jax}'" if jax else ""))


def install_sglang() -> str:
    """The SGLang server's environment, once per machine (``make sglang-real-venv`` with ``$PY``)."""
    return 'make sglang-real-venv PY311="$PY"'
