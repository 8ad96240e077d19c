"""Stand-in for the ``sgl_kernel`` package under SGLang's CPU engine.

What it replaces: ``sglang==0.5.23`` started with ``SGLANG_USE_CPU_ENGINE=1
--device cpu`` imports eight ``*_cpu`` kernels from ``sgl_kernel`` at module
level (``sglang/srt/mem_cache/allocation.py``,
``sglang/kernels/ops/kvcache/cache_move.py``,
``sglang/kernels/ops/speculative/{cache_locs,eagle,spec_tree}.py``). The
``sglang-kernel`` wheel on the registry is a CUDA build: importing it on a
machine without ``libcuda.so.1`` raises ImportError ("Could not load any
common_ops library"), and no CPU build of it is published, so the server
cannot even start. Its parent directory (``sao/rollout/sgl_kernel_cpu``,
``sao.rollout.sglang_server.SGL_KERNEL_CPU_PATH``) goes first on the server's
``PYTHONPATH`` (``launch/sglang_fleet.py --backend=torch --device=cpu`` puts it
there; so do the tests) and shadows the real package. It is not part of the
``sao`` package: only SGLang's interpreter imports it.

Why guards and no kernels: all eight belong to speculative decoding (draft
cache locations, tree building and verification, bonus tokens) or to moving
KV entries between slots for it (``assign_req_to_token_pool_cpu`` is reached
only through ``alloc_for_spec_decode``, ``copy_all_layer_kv_cache_cpu`` only
through ``move_kv_cache``). Plain decoding, prefix-cache hits,
``/update_weights_from_disk`` and ``/flush_cache`` call none of them (found by
logging every access and call while serving the tests' requests: eight
imports, zero calls). So each name exists for the import to succeed and
raises NotImplementedError naming itself if it is ever called: a guard that
makes a path our tests do not take fail loudly, never a kernel that returns
made-up values. Everything else SGLang's CPU path needs falls back to
torch-native code (attention backend ``torch_native``, sampling ``pytorch``).
Names not listed here are absent, so SGLang's own ``ImportError`` fallbacks
(and its "Ignore import error when loading <model>" for models we do not
serve) behave as without the package.
"""

_IMPORTED_AT_START_ON_CPU = (
    "assign_req_to_token_pool_cpu",            # mem_cache/allocation.py (spec decode)
    "copy_all_layer_kv_cache_cpu",             # kernels/ops/kvcache/cache_move.py
    "assign_draft_cache_locs_contiguous_cpu",  # kernels/ops/speculative/cache_locs.py
    "assign_extend_cache_locs_cpu",            # kernels/ops/speculative/cache_locs.py
    "fill_accept_out_cache_loc_cpu",           # kernels/ops/speculative/eagle.py
    "fill_bonus_tokens_cpu",                   # kernels/ops/speculative/eagle.py
    "build_tree_kernel_efficient_cpu",         # kernels/ops/speculative/spec_tree.py
    "verify_tree_greedy_cpu",                  # kernels/ops/speculative/spec_tree.py
)


def _guard(name: str):
    def guard(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this is SAO's CPU stand-in for sgl_kernel "
            f"(sao/rollout/sgl_kernel_cpu), which only lets SGLang's CPU engine import; "
            f"{name} serves speculative decoding, which SAO's CPU fleet does not use")
    guard.__name__ = guard.__qualname__ = name
    return guard


globals().update({name: _guard(name) for name in _IMPORTED_AT_START_ON_CPU})
__all__ = list(_IMPORTED_AT_START_ON_CPU)
