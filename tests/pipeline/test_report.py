"""`kq journal report` on Spark, on a journal made with designed answers: 200 jobs of which
every tenth is cancelled once, and 3 that expire. Every number of the summary is checked,
the latencies against the journal itself."""

import json
import math
import time

import pandas as pd
import pytest
from confluent_kafka import Producer

from broker.client import QueueClient
from tests.integration.kit import kq, publish, serving_one_queue, wait_for

pytestmark = pytest.mark.integration

JOBS, EXPIRED = 200, 3


def nearest_rank(values: list[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


@pytest.mark.timeout(400)  # starts Spark in a `kq journal report` process
@pytest.mark.one_broker  # the journal's Spark read runs on both: tests/pipeline/test_sources.py
def test_the_report_counts_what_the_journal_says(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "RPT", 'expiration = "30m"\n') as (
            name, cfg, prefix, _):
        old = int(time.time() * 1000) - 3_600_000  # an hour old: past the expiration
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(EXPIRED):
            p.produce(name, json.dumps({"n": -1 - i}).encode(), b"k", timestamp=old)
        assert p.flush(10) == 0

        def queue_row():
            return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]

        wait_for(lambda: queue_row()["removed"].get("expired") == EXPIRED, 20, "expiry")
        publish(bootstrap, name, [json.dumps({"n": i}).encode() for i in range(JOBS)], key=b"k")
        acked = 0
        with QueueClient(bootstrap, topic_prefix=prefix, name=f"worker-{prefix}") as c:
            for msg in c.subscribe(name, max_backlog=10).messages(timeout=10):
                if msg.data["n"] % 10 == 0 and msg.delivery_count == 1:
                    msg.cancel()
                    continue
                msg.ack()
                acked += 1
                if acked == JOBS:
                    break
            c.flush()
        wait_for(lambda: queue_row()["acked"] == JOBS, 20, "every ack journaled")

        out = kq("journal", "report", "--out", str(tmp_path / "rep"), "--config", str(cfg),
                 "--json", timeout=300)
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        journal = [json.loads(li) for li in kq("journal", "dump", "--config", str(cfg),
                                                 "--json").stdout.splitlines()]

    q = summary["queues"][name]
    assert summary["records"] == len(journal)
    assert (q["enqueued"], q["acked"], q["redelivered"]) == (JOBS + EXPIRED, JOBS, JOBS // 10)
    assert q["removed"] == {"expired": EXPIRED}
    assert q["deliveries_histogram"] == {"1": JOBS - JOBS // 10, "2": JOBS // 10}
    # latencies and processing times, recomputed from the journal rows
    enq = {r["bookmark"]: r["at_ms"] for r in journal if r["kind"] == "enqueued"}
    lease = {r["bookmark"]: r["at_ms"] for r in journal if r["kind"] == "leased"}  # the last
    acks = [r for r in journal if r["kind"] == "acked"]
    latencies = [r["at_ms"] - enq[r["bookmark"]] for r in acks]
    assert q["latency_ms"] == {f"p{round(p * 100)}": nearest_rank(latencies, p)
                               for p in (0.5, 0.9, 0.99)}
    processing = [r["at_ms"] - lease[r["bookmark"]] for r in acks]
    assert q["subscribers"] == {f"worker-{prefix}": {
        "acked": JOBS, "mean_processing_ms": round(sum(processing) / JOBS, 3)}}

    messages = pd.read_parquet(tmp_path / "rep" / "messages")
    assert len(messages) == JOBS + EXPIRED
    assert messages["outcome"].value_counts().to_dict() == {"acked": JOBS, "removed": EXPIRED}
    assert set(messages[messages["outcome"] == "removed"]["reason"]) == {"expired"}
    per_minute = pd.read_parquet(tmp_path / "rep" / "per_minute")
    assert (per_minute["enqueued"].sum(), per_minute["acked"].sum()) == (JOBS + EXPIRED, JOBS)
    png = (tmp_path / "rep" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())["queues"] == \
        summary["queues"]
