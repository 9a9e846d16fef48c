"""The processes `ops/bench.py` starts: the raw relay and subscribers, kq subscribers, the
leaser that holds leases across a restart; and the publisher they share.

    python ops/bench_roles.py ROLE ARGS...   (ops/bench.py runs these; not meant by hand)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from broker.kafka import clients, stats  # noqa: E402

# A phase's results: figures, and dicts of them by role or thread
Figures = dict[str, Any]


def _producer(bs: str) -> Producer:
    return Producer({"bootstrap.servers": bs, "linger.ms": 5, **stats.settings()})


def _consumer(bs: str, topics: list[str]) -> Consumer:
    c = Consumer({"bootstrap.servers": bs, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, "auto.offset.reset": "earliest",
                  **stats.settings()})
    c.assign([TopicPartition(t, 0, 0) for t in topics])
    return c


PACED = b'"paced"'  # in the paced run's records; warm-up records before it have none


def warm_up(bs: str, topic: str, ready: list[Path], within_s: float = 60) -> int:
    """Publish a record every 0.1 s until every worker has one (its `ready` file exists), so
    that the paced run is measured with every worker served (a new share group hands out
    its first record seconds after its members subscribe); the records published."""
    sent = 0
    until = time.monotonic() + within_s
    while not all(r.exists() for r in ready) and time.monotonic() < until:
        publish(bs, topic, 1)
        sent += 1
        time.sleep(0.1)
    return sent


def publish(bs: str, topic: str, n: int, rate: float = 0, paced: bool = False) -> None:
    p = _producer(bs)
    start = time.monotonic()
    mark = {"paced": 1} if paced else {}
    for i in range(n):
        if rate:
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        while True:
            try:
                p.produce(topic, json.dumps({"i": i, "pad": "x" * 64, **mark}).encode(),
                          partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(60)


class DrainCpu:
    """A subscriber's CPU from its first record to its last, so that each kind of worker is
    charged for handling records, not for starting Python and its client (the same for
    every kind; `first` and `last` mark the span)."""

    def __init__(self) -> None:
        self._first: float | None = None
        self._last = 0.0

    def started(self) -> None:
        if self._first is None:
            self._first = time.process_time()

    def handled(self) -> None:
        self._last = time.process_time()

    def seconds(self) -> float:
        return 0.0 if self._first is None else max(0.0, self._last - self._first)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def role_relay(bs: str, run: str, n: int, subs: int, marked: bool = False) -> None:
    """Raw baseline: topic -> delivery topics round-robin; count acks until n (with
    `marked`, of the paced run's records)."""
    c = _consumer(bs, [f"{run}.src"] + [f"{run}.ack{i}" for i in range(subs)])
    p = _producer(bs)
    acks, turn = 0, 0
    while acks < n:
        for rec in clients.take(c, 1000, 0.05):
            if rec.error():
                continue
            if rec.topic().endswith(".src"):
                p.produce(f"{run}.d{turn}", rec.value(), timestamp=rec.timestamp()[1],
                          partition=0)
                turn = (turn + 1) % subs
            elif not marked or PACED in (rec.value() or b""):
                acks += 1
        p.poll(0)
    p.flush(10)
    stats.settle(c, p)


def role_raw_sub(bs: str, run: str, i: int, out: str, ready: str = "") -> None:
    """A relay's worker: acks every record; with `ready` (a file written at its first
    record), times only the paced run's."""
    c = _consumer(bs, [f"{run}.d{i}"])
    p = _producer(bs)
    lat: list[float] = []
    first = 0.0
    told, marked = False, bool(ready)  # (the ready file written; only paced records timed)
    cpu = DrainCpu()
    idle = time.monotonic()
    while time.monotonic() - idle < 3:
        got = clients.take(c, 1000, 0.05)
        for rec in got:
            if rec.error():
                continue
            if marked and not told:
                Path(ready).write_text("1")
                told = True
            if not marked or PACED in (rec.value() or b""):
                first = first or time.time()
                cpu.started()
                lat.append(time.time() * 1000 - rec.timestamp()[1])
            p.produce(f"{run}.ack{i}", rec.value(), partition=0)
            idle = time.monotonic()
        p.poll(0)
        if got:
            cpu.handled()
    p.flush(10)
    Path(out).write_text(json.dumps({"lat": lat, "cpu_s": cpu.seconds(), "first": first}))


def role_kq_sub(bs: str, prefix: str, queue: str, out: str, backlog: int,
                ready: str = "") -> None:
    """A kq worker: acks every message; with `ready` (a file written at its first message),
    times only the paced run's."""
    from broker.client import QueueClient

    lat: list[float] = []
    first = 0.0
    told, marked = False, bool(ready)  # (the ready file written; only paced records timed)
    cpu = DrainCpu()
    with QueueClient(bs, topic_prefix=prefix) as c:
        sub = c.subscribe(queue, max_backlog=backlog)
        for msg in sub.messages(timeout=3):
            if marked and not told:
                Path(ready).write_text("1")
                told = True
            if not marked or PACED in (msg.value or b""):
                first = first or time.time()
                cpu.started()
                lat.append(time.time() * 1000 - msg.timestamp * 1000)
            msg.ack()
            if not sub.buffer:  # the last of what came together: timed per batch, as the
                cpu.handled()  # other kinds are (reading the process's CPU is a system call)
    Path(out).write_text(json.dumps({"lat": lat, "cpu_s": cpu.seconds(), "first": first}))


def role_share_sub(bs: str, group: str, topic: str, out: str, ready: str) -> None:
    """A Kafka share group member (KIP-932) that acknowledges every record explicitly (ACCEPT),
    as a kq worker acks each message. Writes latencies (paced records only, when the run has
    any), its first and last delivery times, its count and its own CPU seconds."""
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bs, "group.id": group,
                       "share.acknowledgement.mode": "explicit", "fetch.wait.max.ms": 10,
                       **stats.settings()})  # (counted as kq's and the relay's workers are)
    c.subscribe([topic])
    lat: list[float] = []
    first = last = 0.0
    count = 0
    cpu = DrainCpu()
    began = idle = time.monotonic()
    while time.monotonic() - idle < 3 or (not count and time.monotonic() - began < 60):
        batch = c.poll(0.05)
        for rec in batch:
            if rec.error():
                continue
            now = time.time()
            if not count:
                first = now
                cpu.started()
                Path(ready).write_text("1")
            count += 1
            last = now
            if PACED in (rec.value() or b""):
                lat.append(now * 1000 - rec.timestamp()[1])
            c.acknowledge(rec)
        if batch:
            c.commit_async()
            cpu.handled()
            idle = time.monotonic()
    c.commit_sync(10)
    c.close()
    Path(out).write_text(json.dumps({"lat": lat, "first": first, "last": last, "count": count,
                                     "cpu_s": cpu.seconds()}))


def role_leaser(bs: str, prefix: str, queue: str, count: int, ready: str) -> None:
    """Lease `count` messages and hold them (heartbeats keep the leases) until killed."""
    from broker.client import QueueClient

    c = QueueClient(bs, name="bench-leaser", topic_prefix=prefix)
    held = 0
    for _ in c.subscribe(queue, max_backlog=count).messages(timeout=30):
        held += 1
        if held == count:
            break
    Path(ready).write_text(str(held))
    while True:
        time.sleep(1)



if __name__ == "__main__":
    role = sys.argv[1]
    if role == "_relay":
        role_relay(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                   sys.argv[6:7] == ["marked"])
    elif role == "_raw_sub":
        role_raw_sub(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], *sys.argv[6:7])
    elif role == "_leaser":
        role_leaser(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    elif role == "_share_sub":
        role_share_sub(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
    elif role == "_kq_sub":
        role_kq_sub(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]),
                    *sys.argv[7:8])
    else:
        raise SystemExit(f"unknown role {role!r}")
