"""CPU per message of kq's own code, without Kafka: the service's path and the client's.

    python ops/bench_cpu.py [--messages 40000] [--backlog 100] [--profile service|client]
                            [--path service|client|steady]

service  N messages arrive at one queue (state in RocksDB, most of the queue paged out, as in
         `ops/bench.py`), then 4 subscribers with max_backlog B ack what they are given, half
         a backlog per ack command, until all are acked: the engine, the deliveries, the
         journal and state encoding and the commit order, against a producer that
         acknowledges at once. Arrivals are not counted; the drain is.
client   the same number of deliveries in envelopes of B/2 (as the service sends them to a
         worker holding B) received, handed out and acked through the client's core.
steady   the service's path at a steady rate the workers keep up with (`--path steady`): N
         messages arrive STEADY_BATCH to a batch, each batch also carrying the acks of what
         the one before delivered, so a message is queued, leased and acked within a state
         write's window, as at `ops/bench.py --rate 5000`. Its arrival is counted, and the
         memory the service kept when it is over (its clock does not move: every lease of
         the run is within one lease period).

`ops/bench.py` measures the same paths with Kafka in between; the difference is the cost of
the Kafka clients and of waiting. `--profile` prints the functions where the time goes
(cProfile, which slows everything about threefold); `--path` runs only one of the two (to
count one path's instructions under callgrind).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client.core import ClientCore, SubscriptionState  # noqa: E402
from broker.config import parse_config  # noqa: E402
from broker.engine import events as ev  # noqa: E402
from broker.engine.transitions import Kind  # noqa: E402
from broker.service.commit import Committer  # noqa: E402
from broker.service.envelopes import Envelopes  # noqa: E402
from broker.service.inputs import Inputs  # noqa: E402
from broker.service.memory import calm_collector  # noqa: E402
from broker.service.service import Service, _Batch  # noqa: E402
from broker.state.pager import RocksPager  # noqa: E402
from broker.state.payload import Payload  # noqa: E402
from broker.state.rocks import RocksStore  # noqa: E402
from broker.values import Bookmark  # noqa: E402
from ops.bench import rss_kb  # noqa: E402

SUBSCRIBERS = 4
PAD = b"x" * 40  # payloads of about the benchmark's size
STEADY_BATCH = 50  # arrivals per loop turn at 5,000 msgs/s, a turn every 10 ms


class _Kafka:
    """What the service's producer does, instantly: every record acknowledged."""

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self._offset = 0

    def produce(self, topic: str, value: Any = None, key: Any = None, **kw: Any) -> None:
        self._pending.append((topic, kw.get("on_delivery")))

    def poll(self, _timeout: float = 0) -> int:
        done, self._pending = self._pending, []
        for topic, callback in done:
            self._offset += 1
            callback(None, _Sent(topic, self._offset))
        return len(done)

    def flush(self, _timeout: float = 0) -> int:
        self.poll()
        return 0


class _Sent:
    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def topic(self) -> str:
        return self._topic

    def offset(self) -> int:
        return self._offset


class _Record:
    """A consumed record, as confluent-kafka hands it over."""

    def __init__(self, topic: str, value: bytes, offset: int = 0) -> None:
        self._topic, self._value, self._offset = topic, value, offset

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value

    def key(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, int(time.time() * 1000))


def _record(topic: str, value: bytes, offset: int = 0) -> Any:
    """A `_Record` where the service wants a confluent-kafka `Message` (duck-typed)."""
    return _Record(topic, value, offset)


def _service(tmp: Path) -> tuple[Service, dict[str, list[tuple[str, int]]]]:
    """A shard's service on RocksDB in `tmp`, without Kafka; and a record of what it
    delivers, by subscription (filled by `_commit`)."""
    config = parse_config({
        "service": {"data_dir": str(tmp), "topic_prefix": "kq"},
        "queue": [{"name": "Q", "underlying_topic": "T",
                   "max_per_subscription_backlog": 100_000}]})
    svc = Service(config, "unused")
    store = RocksStore(tmp / "state", 64 << 20)
    svc.use_pager(RocksPager(tmp / "pager", 64 << 20))
    svc._store = store
    svc._committer = Committer(_Kafka(), store, svc.engine, "kq.journal",  # type: ignore[arg-type]
                               next_batch=0)
    # what the service reads, without consumers (the loop that polls them is not run here)
    svc.inputs = Inputs(None, None, None, svc.router, svc.engine,  # type: ignore[arg-type]
                        ["kq.commands"], {})
    calm_collector()  # as a shard does once it is ready
    return svc, {}


def _commit(svc: Service, batch: _Batch, records: int,
            delivered: dict[str, list[tuple[str, int]]]) -> None:
    """Commit the batch; note what it leased, by subscription (from its journal: a compiled
    Service's methods cannot be wrapped)."""
    svc._commit(batch, records)
    for t in batch.cp.transitions:
        if t.kind == Kind.LEASED and t.sub_id is not None:
            delivered.setdefault(t.sub_id, []).append((str(t.bookmark), t.delivery_count))


def _batch(svc: Service) -> _Batch:
    batch = _Batch()
    svc._batch_payloads = batch.cp.payloads
    return batch


def _arrive(svc: Service, batch: _Batch, start: int, end: int, now: int) -> None:
    for offset in range(start, end):
        value = b'{"n": %d, "pad": "%s"}' % (offset, PAD)
        batch.cp.positions[("Q", "T", 0)] = offset + 1
        svc._source_record(_record("T", value, offset), Bookmark("T", 0, offset), ["Q"],
                           now, batch)


def _subscribed(svc: Service, backlog: int, now: int,
                delivered: dict[str, list[tuple[str, int]]]) -> list[ClientCore]:
    workers = [ClientCore(f"w{i}", "") for i in range(SUBSCRIBERS)]
    batch = _batch(svc)
    for i, w in enumerate(workers):
        for out in w.command("subscribe", sub_id=f"s{i}", queue="Q", max_backlog=backlog,
                             mode="queue"):
            svc._command(_record("kq.commands", out.value), None, now, batch)
    svc._run(ev.Tick(), now, batch)
    _commit(svc, batch, SUBSCRIBERS, delivered)
    svc._committer.flush_held()
    return workers


def _acks(svc: Service, batch: _Batch, workers: list[ClientCore], most: int, now: int,
          delivered: dict[str, list[tuple[str, int]]]) -> tuple[int, int]:
    """Each worker acks up to `most` of what it was given: (commands, messages acked)."""
    commands = acked = 0
    for i, w in enumerate(workers):
        held = delivered.get(f"s{i}", [])
        done, delivered[f"s{i}"] = held[:most], held[most:]
        if not done:
            continue
        for out in w.ack_command("Q", [b for b, _ in done], [n for _, n in done]):
            svc._command(_record("kq.commands", out.value), None, now, batch)
            commands += 1
        acked += len(done)
    return commands, acked


def service_drain(messages: int, backlog: int) -> Callable[[], int]:
    """Arrivals and subscriptions done; returns the drain to time."""
    svc, delivered = _service(Path(tempfile.mkdtemp(prefix="kq-bench-cpu-")))
    now = int(time.time() * 1000)
    for start in range(0, messages, 1000):
        batch = _batch(svc)
        _arrive(svc, batch, start, min(messages, start + 1000), now)
        svc._commit(batch, 1000)
    svc._committer.flush_held()
    workers = _subscribed(svc, backlog, now, delivered)

    def drain() -> int:
        acked = 0
        while acked < messages:
            batch = _batch(svc)
            commands, n = _acks(svc, batch, workers, backlog // 2, now, delivered)
            acked += n
            if not commands:
                raise SystemExit(f"nothing delivered after {acked} acks")
            _commit(svc, batch, commands, delivered)
        svc._committer.flush_held()
        return acked
    return drain


def service_steady(messages: int, backlog: int) -> Callable[[], int]:
    """Subscriptions done; returns the steady run to time (arrivals and acks together)."""
    svc, delivered = _service(Path(tempfile.mkdtemp(prefix="kq-bench-cpu-")))
    now = int(time.time() * 1000)
    workers = _subscribed(svc, backlog, now, delivered)

    def steady() -> int:
        arrived = acked = 0
        while acked < messages:
            batch = _batch(svc)
            commands, n = _acks(svc, batch, workers, backlog, now, delivered)
            acked += n
            end = min(messages, arrived + STEADY_BATCH)
            _arrive(svc, batch, arrived, end, now)
            if not commands and end == arrived:
                raise SystemExit(f"nothing delivered after {acked} acks")
            _commit(svc, batch, commands + end - arrived, delivered)
            arrived = end
        svc._committer.flush_held()
        return acked
    return steady


def client_drain(messages: int, backlog: int) -> Callable[[], int]:
    per_envelope = max(1, backlog // 2)
    envelopes: list[bytes] = []
    for start in range(0, messages, per_envelope):
        env = Envelopes(1 << 20)
        for i in range(start, min(messages, start + per_envelope)):
            payload = Payload(None, b'{"n": %d, "pad": "%s"}' % (i, PAD), [], 1_700_000_000_000)
            env.add("kq.deliver.w0", "s0", "Q", "json", f"T/0/{i}", 1, 1_700_000_030_000,
                    False, i, payload.encode())
        envelopes += [r.value for r in env.records() if r.value is not None]

    class Owner:  # what the sync client does with a batch of acks due
        def _send_acks(self) -> None:
            core.take_acks()

    core = ClientCore("w0", "", owner=Owner())
    sub = SubscriptionState("Q", "s0", "queue", {})
    core.add(sub)
    core.subscribed(sub, {"backlog": backlog})

    def drain() -> int:
        n = 0
        for value in envelopes:
            core.receive(value)
            while sub.buffer:
                sub.buffer.popleft().ack()
                n += 1
        return n
    return drain


def measure(drain: Callable[[], int], profile: bool) -> float:
    """CPU microseconds per message of `drain`."""
    started = time.process_time()
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        n = drain()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    else:
        n = drain()
    return (time.process_time() - started) / n * 1e6


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--backlog", type=int, default=100)
    ap.add_argument("--profile", choices=("service", "client"))
    ap.add_argument("--path", choices=("service", "client", "steady"),
                    help="run only this path")
    a = ap.parse_args(argv)
    out = {}
    if a.path == "steady":
        steady = service_steady(a.messages, a.backlog)
        before = rss_kb(os.getpid())
        out["steady_us_per_msg"] = measure(steady, a.profile == "service")
        gc.collect()
        out["steady_mb_kept"] = (rss_kb(os.getpid()) - before) * 1024 / 1e6
        print(f"CPU per message without Kafka ({a.messages} messages at a steady rate, "
              f"backlog {a.backlog}): kq serve {out['steady_us_per_msg']:.1f} us; "
              f"memory kept {out['steady_mb_kept']:.0f} MB")
        return out
    if a.path != "client":
        out["service_us_per_msg"] = measure(service_drain(a.messages, a.backlog),
                                            a.profile == "service")
    if a.path != "service":
        out["client_us_per_msg"] = measure(client_drain(a.messages, a.backlog),
                                           a.profile == "client")
    said = {"service_us_per_msg": "kq serve", "client_us_per_msg": "client"}
    print(f"CPU per message without Kafka ({a.messages} messages, backlog {a.backlog}): "
          + ", ".join(f"{said[k]} {v:.1f} us" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
