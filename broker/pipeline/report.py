"""`kq journal report`: what happened to each queue's messages, computed on Spark.

The journal is read once. One aggregation per message (queue, bookmark) gives its enqueue
and finish times, outcome, reason, deliveries, who acked it and how long after its last
lease; everything else (summary, per-minute figures, the chart) is derived from that small,
cached frame with Spark SQL functions, no Python UDFs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

FINISHED = ("acked", "removed", "released")
DELIVERED = ("leased", "sent")
PERCENTILES = (0.5, 0.9, 0.99)
ACCURACY = 10_000  # percentile_approx: exact below 10,000 values, within 0.01% of rank above
CHART_BUCKETS_MS = (100, 1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000)
CHART_POINTS = 150


# the journal columns the report reads
REPORT_COLUMNS = "queue,bookmark,kind,at_ms,client,reason"


def journal_frame(spark: SparkSession, bootstrap: str, prefix: str,
                  kafka: Mapping[str, str | int | bool],
                  queue: str | None, since: str | None, until: str | None,
                  columns: str | None = None) -> DataFrame:
    """The kq-journal source with these options (`columns`: a subset, all by default)."""
    reader = (spark.read.format("kq-journal").option("bootstrap.servers", bootstrap)
              .option("topic_prefix", prefix))
    if columns:
        reader = reader.option("columns", columns)
    for key, value in (("queue", queue), ("since", since), ("until", until)):
        if value:
            reader = reader.option(key, value)
    for setting, given in kafka.items():
        reader = reader.option(f"kafka.{setting}", given)
    return reader.load()


def per_message(journal: DataFrame) -> DataFrame:
    """One row per (queue, bookmark); the row with a NULL bookmark per queue gathers the
    transitions of no message (subscriptions, configuration), so `rows` adds up to all."""
    kind, at = F.col("kind"), F.col("at_ms")

    def when(kinds: tuple[str, ...], value: Any) -> Any:
        return F.when(kind.isin(*kinds), value)

    return (journal.groupBy("queue", "bookmark").agg(
        F.count(F.lit(1)).alias("rows"),
        F.min(when(("enqueued",), at)).alias("enqueued_ms"),
        F.max(when(FINISHED, at)).alias("finished_ms"),
        F.max(F.when(kind == "acked", 1).otherwise(0)).alias("was_acked"),
        # a life ends once: its one removal gives the reason, its one ack the client
        F.max(when(("removed", "released"), F.coalesce(F.col("reason"), F.lit("removed"))))
        .alias("reason"),
        F.count(when(DELIVERED, 1)).alias("deliveries"),
        F.max(when(DELIVERED, at)).alias("last_lease_ms"),
        F.max(when(("acked",), F.col("client"))).alias("acked_by"))
        .withColumn("outcome", F.when(F.col("was_acked") == 1, "acked")
                    .when(F.col("finished_ms").isNotNull(), "removed").otherwise("queued"))
        .withColumn("latency_ms", F.when(F.col("outcome") == "acked",
                                         F.col("finished_ms") - F.col("enqueued_ms")))
        .withColumn("processing_ms", F.when(F.col("outcome") == "acked",
                                            F.col("finished_ms") - F.col("last_lease_ms"))))


def summary_of(messages: DataFrame, records: int) -> dict[str, Any]:
    """SPEC 8.1's summary object (without "seconds") from the frame of messages."""
    keys = ["queue", "outcome", "reason", "deliveries", "acked_by"]
    # one job: the counts by every key, and the latency percentiles by queue alone
    rows = messages.groupingSets([keys, ["queue"]], *keys).agg(
        F.count(F.lit(1)).alias("messages"), F.count(F.col("enqueued_ms")).alias("enqueued"),
        F.sum("processing_ms").alias("processing"), F.count("processing_ms").alias("timed"),
        F.percentile_approx("latency_ms", list(PERCENTILES), ACCURACY).alias("p"),
        F.grouping_id().alias("set")).collect()
    facts = [r for r in rows if r["set"] == 0]
    by_queue = [r for r in rows if r["set"] != 0]
    queues: dict[str, Any] = {}
    timing: dict[tuple[str, str], list[int]] = {}
    for r in facts:
        q = queues.setdefault(r["queue"], {
            "enqueued": 0, "acked": 0, "removed": {}, "redelivered": 0,
            "deliveries_histogram": {}, "latency_ms": {}, "subscribers": {}})
        q["enqueued"] += r["enqueued"]
        if r["outcome"] == "acked":
            q["acked"] += r["messages"]
            t = timing.setdefault((r["queue"], r["acked_by"] or "?"), [0, 0, 0])
            t[0] += r["messages"]
            t[1] += r["processing"] or 0
            t[2] += r["timed"]
        elif r["outcome"] == "removed":
            q["removed"][r["reason"]] = q["removed"].get(r["reason"], 0) + r["messages"]
        if r["deliveries"] > 1:
            q["redelivered"] += r["messages"]
        if r["deliveries"] > 0:
            key = str(r["deliveries"])
            q["deliveries_histogram"][key] = q["deliveries_histogram"].get(key, 0) + \
                r["messages"]
    for q in queues.values():
        q["deliveries_histogram"] = dict(sorted(q["deliveries_histogram"].items(),
                                                key=lambda kv: int(kv[0])))
    for (name, client), (acked, total, timed) in sorted(timing.items()):
        queues[name]["subscribers"][client] = {
            "acked": acked, "mean_processing_ms": round(total / timed, 3) if timed else None}
    for r in by_queue:
        if r["queue"] in queues:
            p = r["p"] or [None] * len(PERCENTILES)
            queues[r["queue"]]["latency_ms"] = {"p50": p[0], "p90": p[1], "p99": p[2]}
    return {"records": records, "seconds": 0.0, "queues": queues}


def over_time(messages: DataFrame, buckets_ms: tuple[int, ...]) -> DataFrame:
    """Per queue, bucket size and time bucket: enqueued, acked, removed, ack latency
    p50/p99. Every bucket size in one aggregation: each message counts once where it
    arrived and once where it finished."""

    def bucket(col: str, size: int) -> Any:
        return (F.floor(F.col(col) / size) * size).cast("long")

    def events(col: str, what: str) -> DataFrame:
        return messages.where(F.col(col).isNotNull()).select(
            "queue", F.lit(what).alias("event"), "outcome", "latency_ms",
            *(bucket(col, b).alias(f"b{b}") for b in buckets_ms))

    both = events("enqueued_ms", "arrived").unionByName(events("finished_ms", "finished"))
    finished = F.col("event") == "finished"
    keys = [f"b{b}" for b in buckets_ms]
    rows = both.groupingSets([["queue", k] for k in keys], "queue", *keys).agg(
        F.sum(F.when(F.col("event") == "arrived", 1).otherwise(0)).alias("enqueued"),
        F.sum(F.when(finished & (F.col("outcome") == "acked"), 1).otherwise(0)).alias("acked"),
        F.sum(F.when(finished & (F.col("outcome") == "removed"), 1).otherwise(0))
        .alias("removed"),
        F.percentile_approx(F.when(finished, F.col("latency_ms")), [0.5, 0.99], ACCURACY)
        .alias("p"))
    at = F.coalesce(*(F.col(k) for k in keys))
    size = F.coalesce(*(F.when(F.col(k).isNotNull(), F.lit(b)) for k, b in zip(
        keys, buckets_ms, strict=True)))
    return rows.select("queue", size.alias("bucket_ms"), at.alias("at_ms"),
                       F.timestamp_millis(at).alias("time"), "enqueued", "acked", "removed",
                       F.col("p")[0].alias("latency_p50_ms"),
                       F.col("p")[1].alias("latency_p99_ms"))


def run_report(spark: SparkSession, journal: DataFrame, out: Path) -> dict[str, Any]:
    """Write DIR/summary.json, DIR/messages/, DIR/per_minute/ and DIR/report.png; return the
    summary."""
    from pyspark.sql import Observation

    from broker.pipeline.chart import draw

    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    # One pass over the journal: the per-message frame is written, and what the rest needs
    # of all of it (every transition counted, the time span) is observed on the way; the
    # rest reads the written Parquet back.
    seen = Observation("journal")
    (per_message(journal)
     .observe(seen, F.sum("rows").alias("records"), F.min("enqueued_ms").alias("first"),
              F.max("finished_ms").alias("last"))
     .where(F.col("bookmark").isNotNull())
     .select("queue", "bookmark", "enqueued_ms", "finished_ms", "outcome", "reason",
             "deliveries", "acked_by", "latency_ms", "processing_ms")
     .write.mode("overwrite").parquet(str(out / "messages")))
    observed = seen.get
    messages = spark.read.parquet(str(out / "messages"))
    summary = summary_of(messages, int(observed.get("records") or 0))
    # the chart: the finest bucket that draws at most CHART_POINTS points
    span = (observed.get("last") or 0) - (observed.get("first") or 0)
    bucket_ms = next((b for b in CHART_BUCKETS_MS if span / b <= CHART_POINTS),
                     CHART_BUCKETS_MS[-1])
    frames = over_time(messages, tuple(sorted({60_000, bucket_ms}))).cache()
    (frames.where(F.col("bucket_ms") == 60_000).drop("bucket_ms").orderBy("queue", "at_ms")
     .write.mode("overwrite").parquet(str(out / "per_minute")))
    series = frames.where(F.col("bucket_ms") == bucket_ms).drop("bucket_ms")
    draw(series.toPandas(), summary, bucket_ms, out / "report.png")
    frames.unpersist()
    summary["seconds"] = round(time.monotonic() - started, 3)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
