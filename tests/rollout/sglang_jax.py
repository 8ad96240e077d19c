"""The sglang-jax server (CPU, Python 3.12 venv from `make sglang-venv`) for tests:
its interpreter, server arguments, the tiny random Qwen3 it serves, and our
log-probs of its tokens to compare with the server's."""
import dataclasses
import functools
import pathlib

import jax
import numpy as np
from flax import nnx

from sao.models import get_preset, token_logprobs

REPO = pathlib.Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-sglang" / "bin" / "python"
# The server needs head_dim = 128; everything else is as small as it goes.
CFG = dataclasses.replace(get_preset("tiny"), hidden_size=64, num_layers=2, num_heads=2,
                          num_kv_heads=1, head_dim=128, intermediate_size=128,
                          tie_word_embeddings=False, max_position_embeddings=1024)
SERVER_ARGS = ("--device", "cpu", "--attention-backend", "native", "--dtype", "float32",
               "--max-total-tokens", "1024", "--max-running-requests", "8",
               "--precompile-token-paddings", "64", "--precompile-bs-paddings", "1", "8",
               # Two of four runs on a loaded machine reported wrong log-probs (off by
               # ~0.1-0.3 on a whole completion) with the overlap scheduler on.
               "--disable-overlap-schedule")
PAD = 128


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef, params, seq, temperature):
    return token_logprobs(nnx.merge(graphdef, params), seq, temperature=temperature)


def recomputed(model, prompt, tokens, temperature):
    """Our log-probs (f32[len(tokens)]) of ``tokens`` after ``prompt`` at ``temperature``."""
    seq = np.zeros((1, PAD), np.int32)
    seq[0, :len(prompt) + len(tokens)] = prompt + tokens
    graphdef, params = nnx.split(model)
    lp = np.asarray(_logprobs(graphdef, params, seq, np.float32(temperature)))[0]
    return lp[len(prompt):len(prompt) + len(tokens)]
