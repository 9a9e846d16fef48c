"""Summarise py-spy's collapsed stacks (`--format raw`): the functions where the time goes.

    python ops/profile_top.py FILE [--top 25]

Two tables: "self" (samples whose innermost frame is the function) and "total" (samples with
the function anywhere on the stack), as percentages of all samples. Idle samples (waiting in
poll or flush) show as the Kafka client calls they wait in.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def frames_of(stack: str) -> list[str]:
    # "thread;frame (file:line);frame (file:line)": drop the line so a function is one row
    return [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] + ")"
            if " (" in f else f for f in stack.split(";")[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("file", type=Path)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in a.file.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = frames_of(stack)
        samples += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    for title, table in (("self", own), ("total", total)):
        print(f"-- {title} ({samples} samples)")
        for name, n in table.most_common(a.top):
            print(f"{100 * n / samples:5.1f}%  {name}")


if __name__ == "__main__":
    main()
