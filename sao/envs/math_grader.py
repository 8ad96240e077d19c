"""Free-form math grading with ``math-verify``, safe to call from any thread.

math-verify bounds its own run time with ``signal.alarm``, which only works in
a process's main thread; environment steps run in worker threads. So grading
runs in a small pool of spawned processes, where each task runs in the
worker's main thread (math-verify's own timeouts apply there), and the caller
waits at most ``timeout_s`` more; a pool whose worker is stuck is terminated
and rebuilt (answers being graded by it at that moment score 0).
"""
from __future__ import annotations

import multiprocessing
import threading

_POOL = None
_LOCK = threading.Lock()


def _verify(answer: str, gold: str, timeout_s: int) -> bool:
    """Runs in a pool worker (main thread): parse both sides and compare."""
    from math_verify import parse, verify  # imported in the worker only
    gold_parsed = parse(gold, parsing_timeout=timeout_s)
    pred_parsed = parse(answer, parsing_timeout=timeout_s)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))


def _pool(processes: int):
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = multiprocessing.get_context("spawn").Pool(processes=processes)
        return _POOL


def _discard(pool) -> None:
    global _POOL
    with _LOCK:
        if _POOL is pool:
            _POOL = None
    pool.terminate()


def math_verify_score(answer: str, gold: str, *, timeout_s: int = 5,
                      processes: int = 2) -> float:
    """1.0 if ``answer`` is mathematically equal to ``gold`` per math-verify, else 0.0.

    Args:
      answer: the policy's answer (LaTeX, ``\\boxed{}``, or a plain expression).
      gold: the reference answer.
      timeout_s: seconds for parsing and for verifying (in the worker); the
        caller waits at most ``2 * timeout_s + 10`` seconds in all.
      processes: pool size (used when the pool is first created).

    Never raises on a bad answer (scores 0); raises TypeError if an argument
    is not str.
    """
    if not isinstance(answer, str) or not isinstance(gold, str):
        raise TypeError("answer and gold must be str")
    if not answer.strip():
        return 0.0
    pool = _pool(processes)
    pending = pool.apply_async(_verify, (answer, gold, int(timeout_s)))
    try:
        return 1.0 if pending.get(timeout=2 * timeout_s + 10) else 0.0
    except multiprocessing.TimeoutError:
        _discard(pool)
        return 0.0
    except Exception:  # math-verify failed on this input: not the policy's credit
        return 0.0


def shutdown() -> None:
    """Stops the grading pool (it restarts on the next call)."""
    global _POOL
    with _LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.terminate()
        pool.join()
