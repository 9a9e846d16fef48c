"""TargetQueueDepth end to end: N active, the rest waits in Kafka, early acks honoured."""

import json
import os
from pathlib import Path

import pytest
from confluent_kafka import Producer

from broker.client import QueueClient
from tests.integration.kit import (
    kq,
    publish,
    serving_one_queue,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def served(bootstrap, tmp_path):
    with serving_one_queue(bootstrap, tmp_path, "TQD", "target_queue_depth = 3\n") as (
            name, cfg, prefix, serve):
        yield name, cfg, prefix, serve, tmp_path


def test_only_the_active_part_is_queued_and_everything_arrives_in_order(bootstrap, served):
    name, cfg, prefix, _, _ = served
    bms = publish(bootstrap, name, [b'{"n": %d}' % i for i in range(20)])

    def inspect():
        out = kq("inspect", name, "--config", str(cfg), "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    wait_for(lambda: inspect()["summary"]["enqueued"] == 3, what="three active")
    data = inspect()
    assert [m["bookmark"] for m in data["messages"]] == bms[:3]  # only the active part
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        c.ack(name, [bms[15]])  # not active yet: remembered
        sub = c.subscribe(name, max_backlog=2)
        got = []
        for m in sub.messages(timeout=5):
            got.append(m.bookmark)
            m.ack()
            if len(got) == 19:
                break
    assert got == bms[:15] + bms[16:]  # in order, the early-acked one never delivered
    final = inspect()["summary"]
    assert (final["depth"], final["acked"]) == (0, 20)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def dir_kb(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) // 1024


@pytest.mark.timeout(900)
def test_rss_and_rocksdb_stay_flat_while_a_million_messages_wait(bootstrap, served):
    name, cfg, prefix, serve, tmp = served
    total = int(os.environ.get("KQ_TQD_MESSAGES", "1000000"))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 200000})

    def produce(n: int) -> None:
        for _ in range(n):
            while True:
                try:
                    producer.produce(name, b'{"n": 1}', partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0

    def depth() -> int:
        return json.loads(kq("queues", "--config", str(cfg), "--json").stdout)[0]["depth"]

    produce(20_000)
    wait_for(lambda: depth() == 3, 30, "the active part to fill")  # and reading to stop
    rss_before, db_before = rss_kb(serve.proc.pid), dir_kb(tmp / "state")
    produce(total - 20_000)
    queues = json.loads(kq("queues", "--config", str(cfg), "--json").stdout)  # still answers
    rss_after, db_after = rss_kb(serve.proc.pid), dir_kb(tmp / "state")
    print(f"\n  {total} published, 3 active: service RSS {rss_before} -> {rss_after} kB, "
          f"RocksDB {db_before} -> {db_after} kB")
    assert rss_after - rss_before < 20_000  # flat: well under 20 bytes per waiting message
    assert db_after - db_before < 5_000
    assert queues[0]["depth"] == 3 and queues[0]["enqueued"] == 3
