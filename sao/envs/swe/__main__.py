"""``python -m sao.envs.swe [--tier micro|source|all] [--seed 0] [--per-repo N]``:
builds (or reads from the cache) the task tiers and prints their counts,
e.g. once with network so that later builds run offline."""
from __future__ import annotations

import argparse
import collections
import time

from sao.envs.swe.build import TIERS, build_tier


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sao.envs.swe", description=__doc__)
    parser.add_argument("--tier", choices=(*TIERS, "all"), default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-repo", type=int, default=None,
                        help="tasks per base repository (default: micro 4, source 5)")
    parser.add_argument("--verbose", action="store_true", help="print every candidate bug")
    args = parser.parse_args(argv)
    for tier in TIERS if args.tier == "all" else (args.tier,):
        start = time.monotonic()
        entries = build_tier(tier, seed=args.seed, per_repo=args.per_repo,
                             progress=print if args.verbose else None)
        by_repo = collections.Counter(e["repo"] for e in entries)
        print(f"{tier}: {len(entries)} tasks in {time.monotonic() - start:.0f} s "
              f"({', '.join(f'{r} {n}' for r, n in sorted(by_repo.items()))})")


if __name__ == "__main__":
    main()
