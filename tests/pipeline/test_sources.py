"""The kq-journal and kq-topic data sources: ranges read by Spark tasks give what one reader
gets, typed columns, filters, and a streaming reader that resumes from its checkpoint."""

import json

import pytest
from confluent_kafka import Producer

from broker import wire
from tests.integration.kit import ensure_topic, kq, uid, write_config

pytestmark = pytest.mark.integration

BLANK = {"sub_id": None, "client": None, "delivery_count": 0, "cancel_count": 0,
         "deadline_ms": None, "reason": None, "seq": 0, "timestamp_ms": 0, "max_backlog": 0,
         "filter": None, "priority": None, "barrier": False, "browse": False,
         "principal": None}


def part(batch, i, n, tags, queue="Q"):
    ts = [{**BLANK, "kind": "enqueued", "queue": queue, "at_ms": 1000 + t, "seq": t,
           "bookmark": f"T/0/{t}"} for t in tags]
    return wire.encode("journal", {"batch": batch, "part": i, "parts": n, "written_ms": 0,
                                   "marker": None, "inputs": [], "transitions": ts})


MARKER = wire.encode("journal", {"batch": -1, "part": 0, "parts": 0, "written_ms": 0,
                                 "marker": "m", "inputs": [], "transitions": []})


def write(bootstrap, topic, values):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(10) == 0


def journal_with_a_cut(bootstrap, prefix):
    ensure_topic(bootstrap, f"{prefix}.journal")
    values, tag = [], 0
    for b in range(40):
        n = 1 + b % 3
        if b % 7 == 3:  # a crash after its first part, then the restart marker
            values += [part(b, 0, n + 1, [999_000 + b]), MARKER]
        for i in range(n):
            values.append(part(b, i, n, [tag, tag + 1], queue="Q" if b % 2 else "R"))
            tag += 2
    write(bootstrap, f"{prefix}.journal", values)
    return tag


def test_the_journal_read_in_many_spark_ranges_equals_the_dump(spark, bootstrap, tmp_path):
    prefix = f"kq{uid()}"
    committed = journal_with_a_cut(bootstrap, prefix)
    cfg = write_config(tmp_path / "kq.toml", prefix, [], tmp_path / "s", bootstrap)
    dump = [json.loads(li) for li in kq("journal", "dump", "--config", str(cfg),
                                        "--json").stdout.splitlines()]
    assert len(dump) == committed and not any("999" in r["bookmark"] for r in dump)
    df = (spark.read.format("kq-journal").option("bootstrap.servers", bootstrap)
          .option("topic_prefix", prefix).option("records_per_partition", "7").load())
    assert df.rdd.getNumPartitions() >= 10
    rows = [r.asDict() for r in df.orderBy("offset", "index").collect()]
    assert rows == dump
    assert dict(df.dtypes)["at_ms"] == "bigint" and dict(df.dtypes)["delivery_count"] == "int"
    only_q = (spark.read.format("kq-journal").option("bootstrap.servers", bootstrap)
              .option("topic_prefix", prefix).option("queue", "Q").option("since", "1010")
              .load().collect())
    assert only_q and all(r.queue == "Q" and r.at_ms >= 1010 for r in only_q)
    assert len(only_q) == sum(1 for r in dump if r["queue"] == "Q" and r["at_ms"] >= 1010)


def test_the_topic_source_reads_records_with_types_and_filters(spark, bootstrap):
    topic = f"TS_{uid()}"
    ensure_topic(bootstrap, topic, partitions=2)
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        p.produce(topic, json.dumps({"i": i}).encode(), b"k", partition=i % 2,
                  headers=[("h", str(i).encode())])
    assert p.flush(10) == 0
    df = (spark.read.format("kq-topic").option("bootstrap.servers", bootstrap)
          .option("topics", f"^{topic}$").option("where", "/i >= 20").load())
    rows = df.orderBy("partition", "offset").collect()
    assert [json.loads(r.value)["i"] for r in rows] == [20, 22, 24, 26, 28, 21, 23, 25, 27, 29]
    first = rows[0]
    assert first.bookmark == f"{topic}/0/10" and first.key == b"k"
    assert [(h.key, h.value) for h in first.headers] == [("h", b"20")]
    assert dict(df.dtypes)["timestamp_ms"] == "bigint"


def test_a_streaming_journal_read_resumes_from_its_checkpoint_and_waits_for_whole_batches(
        spark, bootstrap, tmp_path):
    prefix = f"kq{uid()}"
    topic = f"{prefix}.journal"
    ensure_topic(bootstrap, topic)
    write(bootstrap, topic, [part(0, 0, 1, [0, 1]), part(1, 0, 2, [2])])  # batch 1 half there

    def run():
        stream = (spark.readStream.format("kq-journal").option("bootstrap.servers", bootstrap)
                  .option("topic_prefix", prefix).load())
        query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
                 .start())
        query.awaitTermination(120)
        return sorted(r.bookmark for r in spark.read.parquet(str(tmp_path / "out")).collect())

    assert run() == ["T/0/0", "T/0/1"]  # the half-written batch waits
    write(bootstrap, topic, [part(1, 1, 2, [3]), part(2, 0, 1, [4])])
    assert run() == ["T/0/0", "T/0/1", "T/0/2", "T/0/3", "T/0/4"]  # once each


def test_packed_columns_reach_arrow_as_the_rows_they_hold():
    from broker.history.journal import FIELDS
    from broker.pipeline.sources import part_arrow
    from broker.service.journal import encode_columns, transitions_of
    from tests.unit.test_journal_batches import listed_strings, sample_transitions

    part = wire.decode("journal", wire.encode("journal", {
        "batch": 4, "part": 0, "parts": 1, "written_ms": 0, "marker": None, "inputs": [],
        "transitions": [], "columns": encode_columns(sample_transitions())}))
    part["offset"] = 99
    expected = [{f: {"batch": 4, "offset": 99, "index": i, **t}[f] for f in FIELDS}
                for i, t in enumerate(transitions_of(part))]
    assert part_arrow(part).to_pylist() == expected
    listed = {**part, "columns": listed_strings(dict(part["columns"]))}
    assert part_arrow(listed).to_pylist() == expected  # versions 2-6: the strings listed
    old_style = {**part, "columns": None, "transitions": [
        {**t, "max_backlog": 0, "filter": None, "priority": None, "barrier": False,
         "browse": False, "principal": None} for t in transitions_of(part)]}
    assert part_arrow(old_style).to_pylist() == expected  # version 1 parts too
