"""Failover, measured: kill -9 the owner of a deep queue under load and time the takeover.

    python ops/failover.py [--queued 100000] [--standby 0,1] [--session 10s] [--json]
                           [--protocol classic|consumer] [--bootstrap HOST:PORT]

For each `standby_replicas` value: `--queued` messages wait in one queue (one shard);
instance `a` owns it and `b` runs beside it (with `standby_replicas = 1`, `b` keeps the shard
warm). A subscriber drains the queue as fast as it can while a publisher adds 200 msgs/s; 5 s
into the drain `a` is killed with SIGKILL. Timed from the kill:

- `detected_s`: the group gives `b` the shard (its log: "takes shard"): the session timeout
  and the group's rebalance;
- `restore_s`: from then until `b`'s restore ended (its log: "ready: shard");
- `served_s`: the subscriber's first message after its outage (what a user notices).

Then the queue drains, and the run checks what the subscriber saw: every message published
delivered and acked, none delivered again after its ack, no delivery count going back.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from broker.client import QueueClient  # noqa: E402
from broker.kafka import clients  # noqa: E402
from broker.kafka.started import BROKERS, given_or_started  # noqa: E402
from broker.service.status import read_statuses  # noqa: E402
from broker.service.topics import Topics  # noqa: E402
from ops.bench_instances import keep_logs, queue_rows, wait_until  # noqa: E402
from ops.bench_roles import publish  # noqa: E402
from ops.ledger import Ledger  # noqa: E402

DRAIN_BEFORE_KILL_S = 5.0
LOAD_RATE = 200.0  # msgs/s published during the run


class Subscriber(threading.Thread):
    """Acks everything; keeps when each message came and what it saw (SPEC 10)."""

    def __init__(self, bs: str, prefix: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.args = bs, prefix, queue
        self.stop = threading.Event()
        self.times: list[float] = []
        self.ledger = Ledger()

    def run(self) -> None:
        bs, prefix, queue = self.args
        with QueueClient(bs, name=f"failover-{uuid.uuid4().hex[:6]}", topic_prefix=prefix) as c:
            sub = c.subscribe(queue, max_backlog=100)
            while not self.stop.is_set():
                for msg in sub.messages(timeout=0.5):
                    self.times.append(time.time())
                    self.ledger.ack(msg)


class Load(threading.Thread):
    """Publishes LOAD_RATE msgs/s until stopped; counts what Kafka took."""

    def __init__(self, bs: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bs, self.topic = bs, topic
        self.stop = threading.Event()
        self.published = 0

    def _delivered(self, err, _msg) -> None:  # noqa: ANN001
        if err is None:
            self.published += 1

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.bs, "linger.ms": 5})
        i = 0
        start = time.monotonic()
        while not self.stop.is_set():
            p.produce(self.topic, json.dumps({"load": i}).encode(), on_delivery=self._delivered)
            i += 1
            p.poll(max(0.0, start + i / LOAD_RATE - time.monotonic()))
        p.flush(30)


def _config(tmp: Path, bs: str, prefix: str, queue: str, standby: int, session: str,
            protocol: str) -> Path:
    cfg = tmp / f"{prefix}.toml"
    cfg.write_text("\n".join([
        "[service]", f'bootstrap_servers = "{bs}"', f'topic_prefix = "{prefix}"',
        "metrics_port = 0", f'session_timeout = "{session}"', f"standby_replicas = {standby}",
        "[service.kafka]", f'"group.protocol" = "{protocol}"',
        "[[queue]]", f'name = "{queue}"', "max_per_subscription_backlog = 100"]) + "\n")
    return cfg


def _serve(cfg: Path, tmp: Path, name: str) -> subprocess.Popen[bytes]:
    log = open(tmp / f"{cfg.stem}-{name}.log", "ab")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "serve", "--config", str(cfg)], cwd=ROOT,
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "KQ_INSTANCE": name, "KQ_DATA_DIR": str(tmp / f"{cfg.stem}-{name}")})


def _logged_at(log: Path, text: str, after: float) -> float | None:
    """When `log` first says `text` at or after the epoch time `after` (its asctime)."""
    for line in log.read_text(errors="replace").splitlines():
        if text in line:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= after:
                return at
    return None


def _warm(bs: str, prefix: str, standby: int) -> bool:
    """b reports itself, and with a standby its copy of the shard has caught up."""
    consumer = clients.consumer(bs)
    try:
        b = read_statuses(consumer, Topics(prefix).instances).get("b")
    finally:
        consumer.close()
    if b is None or b.at_ms < (time.time() - 3) * 1000:
        return False
    return not standby or (b.standby == [0] and all(v["records"] == 0
                                                     for v in b.lag.values()))


def run_once(bs: str, tmp: Path, queued: int, standby: int, session: str,
             protocol: str) -> dict:
    prefix = f"kqf{uuid.uuid4().hex[:6]}"
    queue = f"{prefix}_Q"
    clients.ensure_topics(clients.admin(bs), [queue])
    publish(bs, queue, queued)
    cfg = _config(tmp, bs, prefix, queue, standby, session, protocol)
    procs = {"a": _serve(cfg, tmp, "a")}

    def gone() -> str | None:
        return next((f"instance {n} exited with {p.returncode};"
                     for n, p in procs.items() if p.poll() is not None and n != "a"), None)

    sub, load = Subscriber(bs, prefix, queue), Load(bs, queue)
    try:
        wait_until("a to own the queue with every message", lambda: any(
            r["owner"] == "a" and r["enqueued"] >= queued for r in queue_rows(bs, prefix)),
            hopeless=lambda: "instance a exited;" if procs["a"].poll() is not None else None)
        procs["b"] = _serve(cfg, tmp, "b")
        wait_until("b to run beside a (and keep the shard warm)",
                   lambda: _warm(bs, prefix, standby), hopeless=gone)
        sub.start()
        load.start()
        wait_until("the first delivery", lambda: sub.times, timeout=60)
        time.sleep(DRAIN_BEFORE_KILL_S)
        depth = sum(r["depth"] for r in queue_rows(bs, prefix))
        killed = time.time()
        procs["a"].send_signal(signal.SIGKILL)
        procs["a"].wait()
        wait_until("b to serve the queue", lambda: any(t > killed + 1 for t in sub.times),
              hopeless=gone)
        load.stop.set()
        load.join()
        total = queued + load.published
        wait_until(f"all {total} messages acked", lambda: len(sub.ledger.acked) >= total,
                   hopeless=gone)
        sub.stop.set()
        sub.join(10)
    except TimeoutError as exc:
        raise SystemExit(f"{exc}; the logs are kept in {keep_logs(tmp, prefix)}") from None
    finally:
        sub.stop.set()
        load.stop.set()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait()
    log_b = tmp / f"{cfg.stem}-b.log"
    taken = _logged_at(log_b, "takes shard 0", killed)
    ready = _logged_at(log_b, "ready: shard 0", killed)
    after = [t for t in sub.times if t > killed]
    # the outage ends at the first message after the longest silence following the kill
    gaps = [(b - a, b) for a, b in zip([killed, *after], after, strict=False)]
    served = max(gaps)[1] if gaps else float("nan")
    return {"standby_replicas": standby, "session_timeout": session, "group_protocol": protocol,
            "queued_at_kill": depth,
            "detected_s": (taken or float("nan")) - killed,
            "restore_s": (ready or float("nan")) - (taken or float("nan")),
            "served_s": served - killed, "published": total, "acked": len(sub.ledger.acked),
            "problems": sub.ledger.problems[:10], "problem_count": len(sub.ledger.problems)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--queued", type=int, default=100_000, help="messages queued at the start")
    ap.add_argument("--standby", default="0,1", help="standby_replicas values to run, in turn")
    ap.add_argument("--session", default="10s", help="[service] session_timeout")
    ap.add_argument("--protocol", choices=("classic", "consumer"), default="classic",
                    help="the group protocol of kq's instances ([service.kafka] group.protocol;"
                         " consumer is KIP-848's, on Apache Kafka 4.0+)")
    ap.add_argument("--bootstrap")
    ap.add_argument("--broker", choices=BROKERS, default="embedded",
                    help="without --bootstrap: the broker to start for the run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    with given_or_started(a.bootstrap, a.broker) as bs, tempfile.TemporaryDirectory() as d:
        for standby in (int(s) for s in a.standby.split(",")):
            results.append(run_once(bs, Path(d), a.queued, standby, a.session, a.protocol))
    if a.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"standby_replicas = {r['standby_replicas']}, {r['queued_at_kill']} queued at "
                  f"the kill: shard taken over after {r['detected_s']:.1f} s, restored in "
                  f"{r['restore_s']:.1f} s, subscriber served again after {r['served_s']:.1f} s;"
                  f" {r['acked']} of {r['published']} acked, {r['problem_count']} problem(s)")
    if any(r["problem_count"] or r["acked"] < r["published"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
