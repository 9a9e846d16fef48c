"""How fast the Spark report reads a journal: `ops/bench.py --pipeline` (or run this alone).

    python ops/bench_pipeline.py [--transitions 1000000] [--bootstrap HOST:PORT]

Writes a journal of the given size to a fresh topic prefix, in the service's own record
format (packed columns) and part size: messages enqueued, leased, acked, with one in ten
cancelled once and leased again. Then runs `kq journal report` on local[2] four times in one
session: the first warms it (JVM, Python workers), the median of the other three is
reported, as journal transitions per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from broker import wire  # noqa: E402
from broker.kafka import clients  # noqa: E402
from broker.kafka.embedded import given_or_embedded  # noqa: E402
from broker.service.journal import TRANSITIONS_PER_PART, encode_columns  # noqa: E402

RUNS = 3  # timed runs after the warm-up one; the median is reported
BLANK = {"bookmark": None, "sub_id": None, "client": None, "delivery_count": 0,
         "cancel_count": 0, "deadline_ms": None, "reason": None, "seq": 0, "timestamp_ms": 0,
         "max_backlog": 0, "filter": None, "priority": None, "barrier": False,
         "browse": False, "principal": None}


def life(queue: str, n: int, at: int) -> list[dict]:
    """The transitions of message n: enqueued, leased, (cancelled and leased again), acked."""
    bm, client = f"{queue}/0/{n}", f"worker-{n % 4}"

    def t(kind: str, dt: int, **kw: object) -> dict:
        return {**BLANK, "kind": kind, "queue": queue, "at_ms": at + dt, "bookmark": bm, **kw}

    out = [t("enqueued", 0, seq=n, timestamp_ms=at),
           t("leased", 2, sub_id=client, client=client, delivery_count=1)]
    if n % 10 == 0:
        out += [t("returned", 5, cancel_count=1, reason="cancelled"),
                t("leased", 7, sub_id=client, client=client, delivery_count=2, cancel_count=1)]
    return [*out, t("acked", 9 + n % 7, client=client)]


def write_journal(bootstrap: str, prefix: str, transitions: int) -> int:
    """A journal of at least `transitions` transitions; returns how many were written."""
    topic = f"{prefix}.journal"
    clients.ensure_topics(clients.admin(bootstrap), [topic])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                  "message.max.bytes": 10_000_000, "compression.type": "lz4"})
    pending: list[dict] = []
    written, batch, n, at = 0, 0, 0, int(time.time() * 1000) - 3_600_000

    def flush_batch() -> None:
        nonlocal batch
        parts = [pending[i:i + TRANSITIONS_PER_PART]
                 for i in range(0, len(pending), TRANSITIONS_PER_PART)]
        for i, chunk in enumerate(parts):
            p.produce(topic, wire.encode("journal", {
                "batch": batch, "part": i, "parts": len(parts), "written_ms": at,
                "marker": None, "inputs": [], "transitions": [],
                "columns": encode_columns([SimpleNamespace(**t) for t in chunk])}), partition=0)
            p.poll(0)
        batch += 1
        pending.clear()

    while written < transitions:
        rows = life("BENCH", n, at)
        pending += rows
        written += len(rows)
        n += 1
        at += 1
        if len(pending) >= 5_000:  # about what one busy service batch journals
            flush_batch()
    if pending:
        flush_batch()
    p.flush(60)
    return written


def measure(bootstrap: str, transitions: int) -> dict[str, float | list[float]]:
    from broker.pipeline.report import REPORT_COLUMNS, journal_frame, run_report
    from broker.pipeline.session import spark_session

    prefix = f"bench{uuid.uuid4().hex[:8]}"
    written = write_journal(bootstrap, prefix, transitions)
    spark = spark_session("local[2]", "kq bench")
    with tempfile.TemporaryDirectory() as tmp:
        frame = journal_frame(spark, bootstrap, prefix, {}, None, None, None, REPORT_COLUMNS)
        run_report(spark, frame, Path(tmp) / "warm")  # warms the JVM and Python workers
        times = []
        for i in range(RUNS):
            started = time.monotonic()
            summary = run_report(spark, frame, Path(tmp) / f"timed{i}")
            times.append(time.monotonic() - started)
            assert summary["records"] == written, (summary["records"], written)
    took = statistics.median(times)
    return {"transitions": written, "seconds": round(took, 2),
            "records_per_s": round(written / took),
            "runs_s": [round(t, 2) for t in times]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--transitions", type=int, default=1_000_000)
    ap.add_argument("--bootstrap")
    a = ap.parse_args()
    with given_or_embedded(a.bootstrap) as bs:
        print(json.dumps(measure(bs, a.transitions)))


if __name__ == "__main__":
    main()
