"""Soak: kill -9 the service at random moments under load, then account for every message.

    python ops/soak.py [--messages 100000] [--kills 50] [--bootstrap HOST:PORT]

Publishes the messages to 2 queues while 4 subscriber processes work them (one cancels 10%,
one lets 5% of its leases lapse, two ack everything) and the service is SIGKILLed and
restarted `--kills` times. Then it waits until both queues are empty and checks, from the
journal and the subscribers' own logs: every published message was enqueued once and ended
acked or removed with a reason; no delivery count went back; no message was delivered after
the lease it was acked under. The crash test `tests/crash/test_random_kills.py` runs it small.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer, TopicPartition  # noqa: E402

from broker import wire  # noqa: E402
from broker.kafka import clients  # noqa: E402
from broker.kafka.embedded import given_or_embedded  # noqa: E402
from broker.service.journal import BatchAssembler, transitions_of  # noqa: E402

BEHAVIOURS = ("ack", "cancel-10%", "lapse-5%", "ack")
BACKLOG = 100


@dataclass
class Report:
    published: int = 0
    kills: int = 0
    acked: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0
    redeliveries: int = 0
    dead_letter_records: int = 0
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"published {self.published}, service killed {self.kills} times",
            f"acked {self.acked}, removed {dict(self.removed)}, "
            f"dead-letter records {self.dead_letter_records}",
            f"deliveries seen by subscribers {self.deliveries} "
            f"(redeliveries {self.redeliveries})",
            f"problems: {len(self.problems)}",
            *self.problems[:20],
        ]


# -- the subscriber process --------------------------------------------------------------------

def subscriber(bootstrap: str, prefix: str, queue: str, behaviour: str, log: str,
               stop_file: str) -> None:
    from broker.client import QueueClient

    rnd = random.Random(log)
    with QueueClient(bootstrap, topic_prefix=prefix) as c, open(log, "w") as out:
        sub = c.subscribe(queue, max_backlog=BACKLOG)
        print("subscribed", flush=True)
        while not (os.path.exists(stop_file) and not sub._buffer):
            for msg in sub.messages(timeout=0.5):
                action = "ack"
                if behaviour == "cancel-10%" and rnd.random() < 0.10:
                    action = "cancel"
                elif behaviour == "lapse-5%" and rnd.random() < 0.05:
                    action = "lapse"
                out.write(json.dumps([msg.bookmark, msg.delivery_count, action]) + "\n")
                if action == "ack":
                    msg.ack()
                elif action == "cancel":
                    msg.cancel()


# -- orchestration -----------------------------------------------------------------------------

def _config(tmp: Path, bootstrap: str, prefix: str, queues: list[str], dlq: str) -> Path:
    lines = ["[service]", f'bootstrap_servers = "{bootstrap}"', f'topic_prefix = "{prefix}"',
             f'data_dir = "{tmp / "state"}"', "metrics_port = 0", 'heartbeat_timeout = "3s"',
             'session_timeout = "3s"']
    for q in queues:
        lines += ["[[queue]]", f'name = "{q}"', 'lease_period = "2s"', "max_deliveries = 10",
                  f"max_per_subscription_backlog = {BACKLOG}",
                  f'dead_letter_topic = "{dlq}"']
    path = tmp / "kq.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Service:
    def __init__(self, cfg: Path, log: Path) -> None:
        self.cfg, self.log = cfg, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        before = self.log.read_text().count("ready:") if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "serve", "--config", str(self.cfg)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while self.log.read_text().count("ready:") <= before:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"kq serve did not start; see {self.log}")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _publish(bootstrap: str, topics: list[str], n: int, out: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def report(err: Any, msg: Any) -> None:
        if err is None:
            out.append(f"{msg.topic()}/{msg.partition()}/{msg.offset()}")

    for i in range(n):
        while True:
            try:
                p.produce(topics[i % len(topics)], json.dumps({"i": i}).encode(), partition=0,
                          on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
            time.sleep(0.01)  # spread the load over the kills
    p.flush(120)


def _queue_rows(bootstrap: str, prefix: str) -> dict[str, dict[str, Any]]:
    from broker.client import QueueClient

    with QueueClient(bootstrap, name="soak-cli", topic_prefix=prefix, request_timeout=5) as c:
        return {r["queue"]: r for r in c.query(what="queues")["queues"]}


def _read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of partition 0 of `topic` (read until a quiet second: used at the end)."""
    c = clients.consumer(bootstrap)
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    quiet = time.monotonic()
    while time.monotonic() - quiet < 1.5:
        got = [r for r in clients.take(c, 5000, 0.2) if not r.error()]
        if got:
            out.extend(got)
            quiet = time.monotonic()
    c.close()
    return out


def _committed_transitions(bootstrap: str, journal: str) -> list[dict[str, Any]]:
    """Transitions of the batches that were committed (whole), in journal order."""
    rows: list[dict[str, Any]] = []
    batches = BatchAssembler()
    for rec in _read_all(bootstrap, journal):
        whole = batches.add(wire.decode("journal", rec.value()))
        if whole is not None:
            rows.extend(t for p in whole for t in transitions_of(p))
    return rows


def check(report: Report, published: list[str], queue_of: dict[str, str],
          transitions: list[dict[str, Any]], deliveries: list[list[Any]]) -> None:
    """Account for every published message from the journal and the subscribers' logs."""
    history: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for t in transitions:
        if t["bookmark"]:
            history[(t["queue"], t["bookmark"])].append(t)
    acked_at_count: dict[str, int] = {}  # bookmark -> delivery count of the acked lease
    for bm in published:
        h = history.get((queue_of[bm], bm), [])
        kinds = [t["kind"] for t in h]
        if kinds.count("enqueued") != 1 or kinds[0] != "enqueued":
            report.problems.append(f"{bm}: enqueued {kinds.count('enqueued')} times: {kinds}")
            continue
        ends = [i for i, k in enumerate(kinds) if k in ("acked", "removed")]
        if ends != [len(kinds) - 1]:
            report.problems.append(f"{bm}: not finished exactly once: {kinds}")
            continue
        last = h[-1]
        counts = [t["delivery_count"] for t in h if t["kind"] == "leased"]
        if counts != sorted(set(counts)):
            report.problems.append(f"{bm}: delivery counts went back: {counts}")
        if last["kind"] == "acked":
            report.acked += 1
            acked_at_count[bm] = counts[-1] if counts else 0
        else:
            report.removed[last["reason"]] += 1
    for bm, dc, _ in deliveries:
        report.deliveries += 1
        if dc > 1:
            report.redeliveries += 1
        if bm in acked_at_count and dc > acked_at_count[bm]:
            report.problems.append(f"{bm}: delivered (count {dc}) after it was acked")


def run(bootstrap: str, messages: int, kills: int, tmp: Path,
        min_gap: float = 0.5, max_gap: float = 2.5, seed: int | None = None) -> Report:
    rnd = random.Random(seed)
    u = uuid.uuid4().hex[:6]
    prefix, dlq = f"soak{u}", f"SOAK_{u}_DLQ"
    topics = [f"SOAK_{u}_A", f"SOAK_{u}_B"]
    clients.ensure_topics(clients.admin(bootstrap), [*topics, dlq])
    service = Service(_config(tmp, bootstrap, prefix, topics, dlq), tmp / "serve.log")
    service.start()
    stop_file = tmp / "stop"
    logs = [tmp / f"sub{i}.jsonl" for i in range(len(BEHAVIOURS))]
    subs = [subprocess.Popen([sys.executable, __file__, "_subscriber", bootstrap, prefix,
                              topics[i % 2], BEHAVIOURS[i], str(logs[i]), str(stop_file)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
            for i in range(len(BEHAVIOURS))]
    for s in subs:
        assert s.stdout is not None and s.stdout.readline().strip() == "subscribed"
    report = Report()
    published: list[str] = []
    publisher = threading.Thread(target=_publish, args=(bootstrap, topics, messages, published))
    publisher.start()
    try:
        for _ in range(kills):
            time.sleep(rnd.uniform(min_gap, max_gap))
            service.kill()
            report.kills += 1
            service.start()
        publisher.join()
        deadline = time.monotonic() + 300
        while True:
            rows = _queue_rows(bootstrap, prefix)
            if all(rows[t]["depth"] == 0 and rows[t]["enqueued"] >= messages // 2
                   for t in topics):
                break
            if time.monotonic() > deadline:
                report.problems.append(f"queues did not drain: {rows}")
                break
            time.sleep(0.5)
    finally:
        stop_file.touch()
        for s in subs:
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
        service.stop()
    report.published = len(published)
    queue_of = {bm: bm.rsplit("/", 2)[0] for bm in published}
    deliveries = [json.loads(line) for log in logs if log.exists()
                  for line in log.read_text().splitlines()]
    check(report, published, queue_of, _committed_transitions(bootstrap, f"{prefix}.journal"),
          deliveries)
    report.dead_letter_records = len(_read_all(bootstrap, dlq))
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--bootstrap")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    started = time.monotonic()
    with given_or_embedded(a.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as d:
        report = run(bootstrap, a.messages, a.kills, Path(d), seed=a.seed)
    print("\n".join(report.lines()))
    print(f"took {time.monotonic() - started:.0f} s")
    sys.exit(1 if report.problems else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_subscriber":
        subscriber(*sys.argv[2:8])
    else:
        main()
