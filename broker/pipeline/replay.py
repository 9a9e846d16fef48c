"""`kq journal replay --engine spark`: the same replay as the local one, done by Spark tasks.

The kq-topic source gives one Spark partition per source partition (`whole_partitions`),
read in offset order; each task produces its partition's matches in that order with its own
idempotent producer and returns its counts. No shuffle, so each source partition's order
is kept, as in the local replay (`broker.history.replay`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from broker.history.replay import ReplayCounts, replay


def replay_on_spark(bootstrap: str, kafka: dict[str, Any], topics: str, to: str,
                    to_partitions: int, where: str | None, since_ms: int | None,
                    until_ms: int | None, dry_run: bool, master: str | None) -> ReplayCounts:
    import pyarrow as pa

    from broker.pipeline.session import spark_session

    spark = spark_session(master, "kq journal replay")
    reader = (spark.read.format("kq-topic").option("bootstrap.servers", bootstrap)
              .option("topics", topics).option("whole_partitions", "true"))
    for key, value in (("where", where), ("since", since_ms), ("until", until_ms)):
        if value is not None:
            reader = reader.option(key, str(value))
    for key, value in kafka.items():
        reader = reader.option(f"kafka.{key}", str(value))

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from broker.kafka import clients

        producer = clients.producer(bootstrap, kafka, **{"linger.ms": 20})
        sources = ((r["topic"], r["partition"], r["offset"], r["key"], r["value"],
                    [(h["key"], h["value"]) for h in r["headers"]])
                   for b in batches for r in b.to_pylist())
        c = replay(producer, sources, to, to_partitions, dry_run)
        yield pa.RecordBatch.from_pydict({"matched": [c.matched], "published": [c.published],
                                          "failed": [c.failed]})

    total = ReplayCounts()
    for row in (reader.load().mapInArrow(task, "matched long, published long, failed long")
                .collect()):
        total.add(ReplayCounts(row["matched"], row["published"], row["failed"]))
    return total
