"""`kq journal dump / grep / replay` against a real broker, with the service running and
stopped (they read Kafka only)."""

import base64
import json
import threading
import time
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer

from broker import wire
from broker.client import QueueClient
from broker.kafka import clients
from broker.kafka.ranges import real_ends
from tests.integration.kit import (
    drain,
    ensure_topic,
    kq,
    publish,
    read_topic,
    serving_one_queue,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


def lines(out) -> list[dict]:
    assert out.returncode == 0, out.stderr
    return [json.loads(li) for li in out.stdout.splitlines() if li.strip()]


def test_dump_shows_each_committed_transition_with_its_filters_also_with_the_service_down(
        bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "JD") as (name, cfg, prefix, serve):
        bms = publish(bootstrap, name, [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'], key=b"k")
        with QueueClient(bootstrap, topic_prefix=prefix, name=f"w-{prefix}") as c:
            for m in drain(c.subscribe(name, max_backlog=2), 2):
                m.ack()
            c.flush()

        def dump(*args):
            return lines(kq("journal", "dump", "--config", str(cfg), "--json", *args))

        wait_for(lambda: len(dump("--kind", "acked")) == 2, what="two acks journaled")
        serve.stop()  # everything below reads Kafka only
        rows = dump("--queue", name)
        kinds = [r["kind"] for r in rows]
        assert kinds.count("enqueued") == 3 and kinds.count("leased") >= 2
        assert kinds[0] == "configured"
        for field in ("batch", "offset", "kind", "queue", "at_ms", "bookmark", "client",
                      "sub_id", "delivery_count", "cancel_count", "reason"):
            assert all(field in r for r in rows)
        assert [r["bookmark"] for r in dump("--kind", "enqueued")] == bms  # oldest first
        life = dump("--bookmark", bms[0])
        assert [r["kind"] for r in life] == ["enqueued", "leased", "acked"]
        assert life[1]["client"] == f"w-{prefix}" and life[1]["delivery_count"] == 1
        assert len(dump("--limit", "2")) == 2
        assert dump("--queue", "NOPE") == []
        nope = kq("journal", "dump", "--config", str(cfg), "--queue", "NOPE")
        assert nope.returncode == 0 and "no queue 'NOPE' in the config" in nope.stderr
        assert len(dump("--since", "-1h")) == len(rows)
        past = datetime.fromtimestamp(time.time() - 3600, UTC).isoformat()
        assert dump("--until", past) == []
        bad = kq("journal", "dump", "--config", str(cfg), "--since", "yesterday")
        assert bad.returncode == 2 and "-15m" in bad.stderr


def _part(batch, i, n, tag):
    t = {"kind": "enqueued", "queue": "Q", "at_ms": 1, "bookmark": f"T/0/{tag}",
         "sub_id": None, "client": None, "delivery_count": 0, "cancel_count": 0,
         "deadline_ms": None, "reason": None, "seq": tag, "timestamp_ms": 0, "max_backlog": 0,
         "filter": None, "priority": None, "barrier": False, "browse": False,
         "principal": None}
    return wire.encode("journal", {"batch": batch, "part": i, "parts": n, "written_ms": 0,
                                   "marker": None, "inputs": [], "transitions": [t]})


def test_dump_leaves_out_a_batch_a_crash_cut_between_its_parts(bootstrap, tmp_path):
    prefix = f"kq{uid()}"
    ensure_topic(bootstrap, f"{prefix}.journal")
    marker = wire.encode("journal", {"batch": -1, "part": 0, "parts": 0, "written_ms": 0,
                                     "marker": "restart", "inputs": [], "transitions": []})
    p = Producer({"bootstrap.servers": bootstrap})
    for value in (_part(0, 0, 1, 0), _part(1, 0, 3, 1), _part(1, 1, 3, 2), marker,
                  _part(1, 0, 2, 3), _part(1, 1, 2, 4), _part(2, 0, 2, 5)):
        p.produce(f"{prefix}.journal", value, partition=0)
    assert p.flush(10) == 0
    cfg = write_config(tmp_path / "kq.toml", prefix, [], tmp_path / "state", bootstrap)
    rows = lines(kq("journal", "dump", "--config", str(cfg), "--json"))
    # batch 1's first try lost its last part; batch 2 is not whole yet
    assert [r["bookmark"] for r in rows] == ["T/0/0", "T/0/3", "T/0/4"]


def test_grep_shows_a_bookmarks_record_and_life_and_searches_topics(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "GR") as (name, cfg, prefix, _):
        (bm,) = publish(bootstrap, name, [b'{"sym": "IBM", "qty": 5}'], key=b"k1",
                        headers=[("region", b"EU")])
        _, last = publish(bootstrap, name, [b'{"sym": "MSFT", "qty": 7}',
                                            b"\xff\xfe not utf-8"],
                          key=b"k1", headers=[("region", b"US")])
        with QueueClient(bootstrap, topic_prefix=prefix) as c:
            (m,) = drain(c.subscribe(name), 1)
            m.ack()
            c.flush()
        wait_for(lambda: lines(kq("journal", "dump", "--config", str(cfg), "--json",
                                  "--kind", "acked")), what="the ack journaled")
        (found,) = lines(kq("journal", "grep", bm, "--config", str(cfg), "--json"))
        assert found["bookmark"] == bm
        record = found["record"]
        assert (record["key"], record["value"]) == ("k1", '{"sym": "IBM", "qty": 5}')
        assert record["headers"] == [{"key": "region", "value": "EU"}]
        assert [t["kind"] for t in found["life"]] == ["enqueued", "leased", "acked"]
        hits = lines(kq("journal", "grep", "--topics", f"^{name}$", "--where",
                        "/qty > 4 AND header('region') = 'US'", "--config", str(cfg), "--json"))
        assert [h["value"] for h in hits] == ['{"sym": "MSFT", "qty": 7}']
        # NOW() is the wall clock in seconds (it was 0 here once)
        recent = lines(kq("journal", "grep", "--topics", f"^{name}$", "--where",
                          "/qty > 4 AND NOW() > 1700000000", "--config", str(cfg), "--json"))
        assert [h["value"] for h in recent] == ['{"sym": "IBM", "qty": 5}',
                                                '{"sym": "MSFT", "qty": 7}']
        by_header = lines(kq("journal", "grep", "--topics", f"^{name}$", "--where",
                             "header('region') = 'US'", "--config", str(cfg), "--json"))
        assert base64.b64decode(by_header[1]["value_b64"]) == b"\xff\xfe not utf-8"
        assert "value" not in by_header[1]
        none = kq("journal", "grep", "NOPE/0/0", "--config", str(cfg), "--json")
        assert none.returncode == 1
        # the last record of a batch is found, where a broker reports an end below it (the
        # embedded one gives 2 here, for offsets 0-2)
        (tail,) = lines(kq("journal", "grep", last, "--config", str(cfg), "--json"))
        assert tail["record"] is not None and tail["record"]["key"] == "k1"
        # a record Kafka cannot have is named (without a fetch's whole timeout first: timed
        # in tests/unit/test_journal_grep_lookup.py, not here on a loaded machine)
        for wrong, said in [(f"NOPE{prefix}/0/0", f"there is no topic NOPE{prefix}"),
                            (f"{name}/7/0", f"{name} has 1 partition(s)"),
                            (f"{name}/0/99", f"past the end of {name}/0: its next offset is")]:
            out = kq("journal", "grep", wrong, "--config", str(cfg))
            assert out.returncode == 1 and said in " ".join(out.stdout.split()), out.stdout
        # a --topics regex that matches nothing is a mistake, as replay says (it was "0
        # records matched in 0 topics", exit 0)
        typo = kq("journal", "grep", "--topics", f"^NOPE{prefix}$", "--config", str(cfg))
        assert typo.returncode == 1 and "no topic matches --topics" in typo.stderr


def test_replay_republishes_matching_records_in_order_with_their_origin(bootstrap, tmp_path):
    u = uid()
    src, dst = f"RP_{u}", f"RP_{u}_AGAIN"
    ensure_topic(bootstrap, src, partitions=2)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(40):
        p.produce(src, json.dumps({"i": i, "odd": i % 2}).encode(), b"key", partition=i % 2,
                  headers=[("n", str(i).encode())])
    assert p.flush(10) == 0
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [], tmp_path / "state", bootstrap)
    args = ["journal", "replay", "--topics", f"^{src}$", "--to", dst, "--where", "/odd = 1",
            "--config", str(cfg), "--json"]
    assert lines(kq(*args, "--dry-run"))[-1] == {"matched": 20, "published": 0, "failed": 0}
    assert lines(kq(*args))[-1] == {"matched": 20, "published": 20, "failed": 0}
    got = read_topic(bootstrap, dst, 20)
    assert len(got) == 20 and {r.partition() for r in got} == {1}  # source partition kept
    assert [json.loads(r.value())["i"] for r in got] == list(range(1, 40, 2))  # in order
    first = got[0]
    assert first.key() == b"key"
    assert dict(first.headers()) == {"n": b"1", "kq-replayed-from": f"{src}/1/0".encode()}


def test_replay_counts_what_kafka_refuses_and_exits_1(bootstrap, tmp_path):
    u = uid()
    src = f"RF_{u}"
    ensure_topic(bootstrap, src)
    publish(bootstrap, src, [b'{"small": 1}', json.dumps({"big": "x" * 5000}).encode()])
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [], tmp_path / "state", bootstrap)
    cfg.write_text(cfg.read_text() + '[service.kafka]\n"message.max.bytes" = 2000\n')
    out = kq("journal", "replay", "--topics", f"^{src}$", "--to", f"{src}_TO", "--config",
             str(cfg), "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout.splitlines()[-1]) == {"matched": 2, "published": 1, "failed": 1}


@pytest.mark.one_broker  # the journal's Spark read runs on both: tests/pipeline/test_sources.py
def test_replay_on_spark_gives_what_the_local_replay_gives(bootstrap, tmp_path):
    u = uid()
    src = f"RS_{u}"
    ensure_topic(bootstrap, src, partitions=3)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(90):
        p.produce(src, json.dumps({"i": i}).encode(), f"k{i % 5}".encode(), partition=i % 3,
                  headers=[("n", str(i).encode())])
    assert p.flush(10) == 0
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [], tmp_path / "state", bootstrap)
    counts = {}
    for engine in ("local", "spark"):
        out = kq("journal", "replay", "--topics", f"^{src}$", "--to", f"{src}_{engine}",
                 "--where", "/i >= 30", "--engine", engine, "--master", "local[2]",
                 "--config", str(cfg), "--json", timeout=300)
        counts[engine] = lines(out)[-1]
    assert counts["spark"] == counts["local"] == {"matched": 60, "published": 60, "failed": 0}
    local = read_topic(bootstrap, f"{src}_local", 60)
    spark = read_topic(bootstrap, f"{src}_spark", 60)

    def by_partition(records):
        return {p: [(r.key(), r.value(), r.headers()) for r in records if r.partition() == p]
                for p in range(3)}

    assert by_partition(spark) == by_partition(local)  # same records, same order, same place


def test_the_end_of_a_partition_written_all_the_time_is_found_in_seconds(bootstrap):
    """A busy service's journal is never quiet: reading it (dump, grep, the Spark sources,
    the audit) must still find an end, one that holds every record written before the call,
    instead of waiting for a pause that never comes."""
    topic = f"busy-{uid()}"
    ensure_topic(bootstrap, topic)
    acked = [0]
    stop = threading.Event()

    def write() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        while not stop.is_set():
            p.produce(topic, b"x", on_delivery=lambda err, _: acked.__setitem__(
                0, acked[0] + (err is None)))
            p.poll(0.002)
        p.flush(10)

    writer = threading.Thread(target=write)
    writer.start()
    c = clients.consumer(bootstrap)
    try:
        wait_for(lambda: acked[0] > 500, 30, "the writer under way")
        written = acked[0]
        started = time.monotonic()
        (low, end), = real_ends(c, [(topic, 0)]).values()
        took = time.monotonic() - started
        assert written > 0 and end >= written and low == 0
        assert took < 5, f"finding the end took {took:.1f} s"
        assert wait_for(lambda: acked[0] > end + 100, 30, "the writer going on")
    finally:
        stop.set()
        writer.join()
        c.close()
