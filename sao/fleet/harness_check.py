"""Is a harness safe to train with? Replays its recorded calls through the endpoint's rules.

Usage (from the repository root)::

    python -m sao.fleet.harness_check --tokenizer=MODEL_DIR_OR_GGUF TRANSCRIPT_OR_DIR ...
    python -m sao.fleet.harness_check --tokenizer=byte runs/x/transcripts --json

Transcripts are JSON lines ``{"request": ..., "response": ...}``, one file per
episode, as the worker's endpoint records them (``EndpointConfig.record_dir``)
or any OpenAI-compatible proxy logs them. The report: the prefix-stability
rate (calls whose history repeats what the session recorded, so that
token-in/token-out holds), the cut histories (where and why a trajectory
would have been cut, and the tokens lost: the recorded ones the cut drops,
``cut_tokens_lost``, plus those the transcript's later calls would have
added, ``tokens_after_cut``; sum: ``tokens_lost_to_cuts``), and the tokens a re-rendering
endpoint would have changed (``retemplated``). Exit status 0 when every
call was prefix-stable, 1 otherwise, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys

from sao.fleet.endpoint.dialect import dialect_for
from sao.fleet.endpoint.transcripts import replay_all


def summarize(reports) -> dict:
    calls = sum(r.calls for r in reports)
    stable = sum(r.stable_calls for r in reports)
    cuts = [{"transcript": r.path, **r.cut} for r in reports if r.cut]
    return {"transcripts": len(reports), "calls": calls, "stable_calls": stable,
            "prefix_stability": stable / calls if calls else 1.0,
            "cut_histories": cuts, "tokens_lost_to_cuts": sum(r.tokens_lost for r in reports),
            "retemplated_tokens": sum(r.retemplated_tokens for r in reports),
            "tito_tokens": sum(r.tito_tokens for r in reports),
            "errors": {k: sum(r.errors.get(k, 0) for r in reports)
                       for k in sorted({k for r in reports for k in r.errors})}}


def report_text(summary: dict) -> str:
    """``summarize``'s result for a reader, one cut history a line."""
    lines = [f"{summary['transcripts']} transcripts, {summary['calls']} calls: prefix stability "
             f"{summary['prefix_stability']:.1%} ({summary['stable_calls']} stable)",
             f"cut histories: {len(summary['cut_histories'])}, tokens lost to cuts: "
             f"{summary['tokens_lost_to_cuts']}; tokens a re-rendering endpoint would change: "
             f"{summary['retemplated_tokens']} of {summary['tito_tokens']}"]
    for c in summary["cut_histories"]:
        lines.append(f"  {c['transcript']}: call {c['cut_call']}, message {c['cut_message']}: "
                     f"{c['cut_reason']} ({c['cut_tokens_lost']} recorded tokens dropped, "
                     f"{c['tokens_after_cut']} tokens of later calls never reached)")
    if summary["errors"]:
        lines.append(f"refused calls: {summary['errors']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sao.fleet.harness_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", help="transcript files or directories of *.jsonl")
    p.add_argument("--tokenizer", required=True,
                   help="'byte', an HF model directory or a .gguf file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    if args.tokenizer == "byte":
        from sao.models.tokenizer import ByteTokenizer
        tokenizer = ByteTokenizer()
    else:
        from sao.models.tokenizer_loading import load_tokenizer
        tokenizer = load_tokenizer(args.tokenizer)
    summary = summarize(replay_all(args.paths, tokenizer, dialect_for(tokenizer)))
    print(json.dumps(summary, indent=2) if args.json else report_text(summary))
    return 0 if summary["stable_calls"] == summary["calls"] else 1


if __name__ == "__main__":
    sys.exit(main())
