"""Where a process's Python time goes, from py-spy's raw stacks (bench/gpu/watch.sh writes them).

    python -m bench.gpu.stacks FILE [FILE ...] [--top 40] [--ticks 1000]

Prints each frame's inclusive share of the samples (the frame anywhere on the stack) and each
leaf's share (the frame on top), both against every sample of the files given. py-spy records
busy threads only, so with `--ticks` (the sampling ticks of one file: seconds x rate, 1,000 for
watch.sh's 5 s at 200 Hz) it also prints the shares of the time: a one-thread process's
busy fraction is its samples per tick.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path


def frame(text: str) -> str:
    """`function (path/to/file.py:123)` as `function file.py:123`."""
    name, _, where = text.partition(" (")
    return f"{name} {where.rstrip(')').rsplit('/', 1)[-1]}".strip()


def shares(paths: list[Path]) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, inclusive counts, leaf counts) over py-spy `--format raw` files."""
    total, inclusive, leaves = 0, Counter[str](), Counter[str]()
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            samples, frames = int(count), [frame(f) for f in stack.split(";")]
            total += samples
            inclusive.update(dict.fromkeys(set(frames), samples))
            leaves[frames[-1]] += samples
    return total, inclusive, leaves


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.stacks")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--ticks", type=int, help="sampling ticks per file (seconds x rate)")
    args = parser.parse_args(argv)
    total, inclusive, leaves = shares(args.files)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    print(f"{total} samples in {len(args.files)} file(s)")
    ticks = args.ticks * len(args.files) if args.ticks else None
    if ticks:
        print(f"{total / ticks:.1%} of {ticks} ticks: busy samples per tick, over all threads")
    print("\ninclusive:" + ("   (of the samples, of the ticks)" if ticks else ""))
    for name, count in inclusive.most_common(args.top):
        of_time = f"  {100 * count / ticks:5.1f} %" if ticks else ""
        print(f"{100 * count / total:5.1f} %{of_time}  {name}")
    print("\nleaf:")
    for name, count in leaves.most_common(args.top // 2):
        print(f"{100 * count / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
