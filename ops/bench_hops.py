"""Where kq's publish -> deliver latency goes, hop by hop, at a paced rate.

    python ops/bench_hops.py [--broker apache|embedded] [--bootstrap HOST:PORT] [--rate 5000]
                             [--seconds 5] [--runs 3] [--json]

Each run starts `kq serve` on a fresh queue with four subscribers (max_backlog 500, acking
every message), publishes --rate msgs/s for --seconds, then splits each message's latency in
three, from what Kafka keeps:

  source   published (the record's timestamp) -> leased by the service (the journal's `at_ms`,
           the time the batch that leased it began)
  commit   leased -> its delivery produced (the envelope record's timestamp): the rest of the
           batch, the journal's round trip and the wait for the batches before it
  deliver  delivery produced -> in the subscriber's hands

A first run, not reported, warms the broker (Apache Kafka compiles its hot paths meanwhile).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker import wire  # noqa: E402
from broker.kafka import clients  # noqa: E402
from broker.kafka.started import BROKERS, given_or_started  # noqa: E402
from ops.bench import start_service, write_config  # noqa: E402
from ops.bench_kafka import make_topics  # noqa: E402
from ops.bench_roles import percentile, publish  # noqa: E402

HOPS = ("source", "commit", "deliver", "total")
SUBSCRIBERS, BACKLOG = 4, 500


def split(received: dict[str, tuple[float, float]], leased: dict[str, int],
          produced: dict[str, int]) -> list[tuple[float, float, float, float]]:
    """Per message received (bookmark -> (got at, published at), ms): its (source, commit,
    deliver, total) ms, from when the journal says it was leased and its envelope produced."""
    return [(leased[bm] - published, produced[bm] - leased[bm], got - produced[bm],
             got - published)
            for bm, (got, published) in received.items() if bm in leased and bm in produced]


def summary(rows: Sequence[tuple[float, ...]]) -> dict[str, dict[str, float]]:
    return {hop: {f"p{int(q * 100)}_ms": round(percentile([r[k] for r in rows], q), 1)
                  for q in (0.5, 0.9, 0.99)} for k, hop in enumerate(HOPS)}


def run(bs: str, tmp: Path, rate: float, seconds: float) -> dict[str, dict[str, float]]:
    prefix = f"kqh{uuid.uuid4().hex[:6]}"
    queue = f"{prefix}_Q"
    make_topics(bs, [queue])
    cfg = write_config(tmp, bs, prefix, queue, BACKLOG)
    proc, _ = start_service(cfg, tmp / f"{prefix}.log")
    try:
        outs = [tmp / f"{prefix}-{i}.json" for i in range(SUBSCRIBERS)]
        subs = [subprocess.Popen([sys.executable, __file__, "_sub", bs, prefix, queue, f"h{i}",
                                  str(out)], cwd=ROOT) for i, out in enumerate(outs)]
        time.sleep(2)  # subscribed
        publish(bs, queue, int(rate * seconds), rate)
        for s in subs:
            s.wait()
        received = {bm: (got, ts) for out in outs for bm, got, ts in json.loads(out.read_text())}
        leased = leases(cfg)
        produced: dict[str, int] = {}
        for i in range(SUBSCRIBERS):
            produced.update(envelopes(bs, f"{prefix}.deliver.h{i}"))
    finally:
        proc.terminate()
        proc.wait()
    return summary(split(received, leased, produced))


def leases(cfg: Path) -> dict[str, int]:
    """Bookmark -> when it was first leased (ms), from the journal."""
    out = subprocess.run([sys.executable, "-m", "cli.main", "journal", "dump", "--kind",
                          "leased", "--json", "--config", str(cfg)], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    first: dict[str, int] = {}
    for line in out.splitlines():
        t = json.loads(line)
        first.setdefault(t["bookmark"], t["at_ms"])
    return first


def envelopes(bs: str, topic: str) -> dict[str, int]:
    """Bookmark -> when the envelope delivering it first was produced (ms)."""
    c = clients.consumer(bs)
    c.assign([TopicPartition(topic, 0, 0)])
    produced: dict[str, int] = {}
    idle = time.monotonic()
    while time.monotonic() - idle < 2:
        for rec in clients.take(c, 500, 0.2):
            idle = time.monotonic()
            env = wire.decode("envelope", rec.value()) if not rec.error() else None
            if env is not None and env["kind"] == "messages":
                for bm in env["batch"]["bookmarks"].split("\n"):
                    produced.setdefault(bm, rec.timestamp()[1])
    c.close()
    return produced


def subscriber(bs: str, prefix: str, queue: str, name: str, out: str) -> None:
    from broker.client import QueueClient

    got = []
    with QueueClient(bs, name=name, topic_prefix=prefix) as c:
        for m in c.subscribe(queue, max_backlog=BACKLOG).messages(timeout=3):
            got.append((m.bookmark, time.time() * 1000, m.timestamp * 1000))
            m.ack()
    Path(out).write_text(json.dumps(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--broker", choices=BROKERS, default="apache")
    ap.add_argument("--bootstrap", help="an existing cluster instead of starting one")
    ap.add_argument("--rate", type=float, default=5000.0, help="msgs/s published")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long each run publishes")
    ap.add_argument("--runs", type=int, default=3, help="runs reported (after one warm-up)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args()
    with given_or_started(a.bootstrap, a.broker) as bs, tempfile.TemporaryDirectory() as d:
        run(bs, Path(d), a.rate, a.seconds)  # warm-up
        runs = [run(bs, Path(d), a.rate, a.seconds) for _ in range(a.runs)]
    if a.json:
        print(json.dumps({"rate": a.rate, "runs": runs}))
        return
    for i, r in enumerate(runs):
        print(f"run {i + 1}: " + "; ".join(
            f"{hop} {v['p50_ms']}/{v['p90_ms']}/{v['p99_ms']}" for hop, v in r.items())
            + " ms (p50/p90/p99)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["_sub"]:
        subscriber(*sys.argv[2:7])
    else:
        main()
