"""Engine-only benchmark of dispatch behind a deep queue (no Kafka, no disk).

Two cases that used to cost O(depth) per event:
  filter   a filtered subscriber waits for rare matches while N unmatched messages wait
  barrier  a barrier waits for acks while N messages are held behind it

Prints the engine time per arriving message. Run: python ops/bench_dispatch.py [--depth N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.config import QueueConfig  # noqa: E402
from broker.engine import events as ev  # noqa: E402
from broker.engine.engine import Engine  # noqa: E402
from broker.expr import Doc  # noqa: E402
from broker.values import Bookmark  # noqa: E402

NOW = 1_000_000


class Feed:
    def __init__(self, engine: Engine) -> None:
        self.engine, self.offset = engine, 0

    def publish(self, data: dict) -> None:
        bm = Bookmark("T", 0, self.offset)
        self.offset += 1
        self.engine.handle(ev.MessageArrived("Q", bm, NOW, 10, Doc(data, {})), NOW)


def timed(feed: Feed, arrivals: int, data: dict) -> float:
    """Milliseconds of engine time per arriving message."""
    started = time.perf_counter()
    for _ in range(arrivals):
        feed.publish(data)
    return (time.perf_counter() - started) / arrivals * 1000


def filter_case(depth: int, arrivals: int) -> float:
    feed = Feed(Engine([QueueConfig(name="Q")]))
    for _ in range(depth):
        feed.publish({"sym": "MSFT"})
    feed.engine.handle(ev.Subscribed("w", "w-Q", "Q", 10, "r", "/sym = 'IBM'"), NOW)
    return timed(feed, arrivals, {"sym": "MSFT"})


def barrier_case(depth: int, arrivals: int) -> float:
    feed = Feed(Engine([QueueConfig(name="Q", barrier_expression="/flush = true")]))
    for _ in range(10):
        feed.publish({"flush": False})
    feed.publish({"flush": True})
    for _ in range(depth):
        feed.publish({"flush": False})
    feed.engine.handle(ev.Subscribed("w", "w-Q", "Q", 10, "r"), NOW)  # leases the first 10
    return timed(feed, arrivals, {"flush": False})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--depth", type=int, default=20000)
    ap.add_argument("--arrivals", type=int, default=500)
    a = ap.parse_args()
    print(f"filter : {filter_case(a.depth, a.arrivals):.3f} ms per arrival behind "
          f"{a.depth} unmatched waiting messages")
    print(f"barrier: {barrier_case(a.depth, a.arrivals):.3f} ms per arrival behind a waiting "
          f"barrier and {a.depth} held messages")


if __name__ == "__main__":
    main()
