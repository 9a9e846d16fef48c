"""Engine-only benchmark of dispatch behind a deep queue (no Kafka, no disk).

For each queue type, N messages wait in the queue; then each step is one arrival plus one
ack by a subscriber that holds a full backlog (so the ack makes room and dispatch picks the
next message). Prints the engine time per step at each depth, side by side: dispatch is
O(log n) when the figure does not grow with the depth.

  plain             oldest first
  priority          /p, ten levels
  levels            priority_levels = 3, from the kq-priority header (Qpid)
  filter            a filtered subscriber waits for rare matches among N unmatched ones
  clock-filter      the same with a filter reading NOW() (no index: a bounded walk per step)
  barrier           a barrier waits for acks while N messages are held behind it
  target-depth      TargetQueueDepth N: the active part is N deep
  priority+barrier  priority queue holding a barrier
  sorted            sort_key /k: random numbers and strings (Qpid sorted queue)
  lvq               lvq_key /k over `depth` keys: arrivals replace older values (Qpid LVQ)
  ring              max_messages = depth, overflow_policy = ring: each arrival removes one
  groups            group_key /g over 1,000 groups, behind depth/2 messages of one group
                    that another subscription holds and never acks (Qpid message groups)

Run: python ops/bench_dispatch.py [--depths 20000,1000000] [--steps 500] [--cases ...]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.config import QueueConfig  # noqa: E402
from broker.engine import events as ev  # noqa: E402
from broker.engine.effects import Deliver  # noqa: E402
from broker.engine.engine import Engine  # noqa: E402
from broker.expr import Doc  # noqa: E402
from broker.values import Bookmark  # noqa: E402

NOW = 1_000_000
BACKLOG = 10


class Feed:
    """One queue "Q" on topic T, fed and drained through the engine."""

    def __init__(self, **queue: object) -> None:
        self.engine = Engine([QueueConfig(name="Q", **queue)])  # type: ignore[arg-type]
        self.offset = 0
        self.held: list[Bookmark] = []
        self.rng = random.Random(7)

    def publish(self, data: dict) -> None:
        bm = Bookmark("T", 0, self.offset)
        self.offset += 1
        # "kq-priority" in the data stands for the record header of that name
        headers = {"kq-priority": data.pop("kq-priority")} if "kq-priority" in data else {}
        self.take(self.engine.handle(
            ev.MessageArrived("Q", bm, NOW, 10, Doc(data, headers), headers), NOW))

    def subscribe(self, sub_id: str, filter: str | None = None) -> None:
        self.take(self.engine.handle(ev.Subscribed("w", sub_id, "Q", BACKLOG, "r", filter), NOW))

    def ack_one(self) -> None:
        if self.held:
            bm = self.held.pop(0)
            self.take(self.engine.handle(ev.Acked("w", "Q", (bm,), ""), NOW))

    def take(self, effects: list) -> None:
        self.held += [e.bookmark for e in effects if isinstance(e, Deliver) and not e.is_barrier]


def plain(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed()
    return feed, lambda: {"n": 1}


def priority(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(priority="/p")
    return feed, lambda: {"p": feed.rng.randrange(10)}


def levels(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(priority_levels=3)
    return feed, lambda: {"kq-priority": str(feed.rng.randrange(10)).encode()}


def filtered(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed()
    return feed, lambda: {"sym": "IBM" if feed.rng.random() < 0.001 else "MSFT"}


def clock_filtered(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed()
    return feed, lambda: {"due": 0 if feed.rng.random() < 0.001 else 2 * NOW}


def barrier(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(barrier_expression="/flush = true")
    return feed, lambda: {"flush": False}


def target_depth(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(target_queue_depth=depth)
    return feed, lambda: {"n": 1}


def priority_barrier(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(priority="/p", barrier_expression="/flush = true")
    return feed, lambda: {"p": feed.rng.randrange(10), "flush": False}


def sorted_by_key(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(sort_key="/k")
    return feed, lambda: {"k": feed.rng.random() if feed.rng.random() < 0.5
                          else f"s{feed.rng.randrange(10**6)}"}


def last_value(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(lvq_key="/k")
    return feed, lambda: {"k": feed.rng.randrange(depth)}


def ring(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(max_messages=depth, overflow_policy="ring")
    return feed, lambda: {"n": 1}


def groups(depth: int) -> tuple[Feed, Callable[[], dict]]:
    feed = Feed(group_key="/g")
    for _ in range(depth // 2):
        feed.publish({"g": "busy"})
    feed.subscribe("busy")  # takes the group "busy": the rest of it waits at the front
    feed.held.clear()  # never acked
    return feed, lambda: {"g": f"g{feed.rng.randrange(1000)}"}


CASES = {"plain": plain, "priority": priority, "levels": levels, "filter": filtered,
         "clock-filter": clock_filtered, "barrier": barrier,
         "target-depth": target_depth, "priority+barrier": priority_barrier,
         "sorted": sorted_by_key, "lvq": last_value, "ring": ring, "groups": groups}


def measure(case: str, depth: int, steps: int) -> float:
    """Milliseconds of engine time per step (one arrival, one ack) at this depth."""
    feed, data = CASES[case](depth)
    if case in ("barrier", "priority+barrier"):
        for _ in range(BACKLOG):
            feed.publish(data())
        feed.publish({"flush": True})  # waits for the first BACKLOG to be acked
    for _ in range(depth - len(feed.engine.queues["Q"].messages)):
        feed.publish(data())
    if case == "filter":
        feed.subscribe("f", "/sym = 'IBM'")
    if case == "clock-filter":
        feed.subscribe("f", "/due <= NOW()")
    feed.subscribe("w")
    if case in ("barrier", "priority+barrier"):
        feed.held.clear()  # never acked: the barrier keeps waiting
    started = time.perf_counter()
    for _ in range(steps):
        feed.publish(data())
        feed.ack_one()
    return (time.perf_counter() - started) / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--depths", default="20000,1000000")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    print(f"{'ms per step at depth':20}" + "".join(f"{d:>12,}" for d in depths))
    for case in a.cases.split(","):
        row = [measure(case, d, a.steps) for d in depths]
        print(f"{case:20}" + "".join(f"{ms:12.3f}" for ms in row), flush=True)


if __name__ == "__main__":
    main()
