"""A bounded journal on Apache Kafka, which applies retention (the embedded broker does not):
a restore after the journal's head was deleted starts from the snapshot; a journal that could
delete what a restore needs is refused; underlying records deleted before kq read them are
counted and logged. Retention is simulated by DeleteRecords, which moves a partition's start
exactly as retention does."""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from broker.client import QueueClient
from tests.integration.kit import (
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    uid,
    wait_for,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SNAPSHOTS = 'snapshot_interval = "2s"\njournal_retention = "1h"'


def delete_before(bootstrap: str, topic: str, offset: int, partition: int = 0) -> None:
    """What retention does: the partition's first offset becomes `offset`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(30)


def inspect(cfg: Path, name: str) -> dict:
    got = kq("inspect", name, "--config", str(cfg), "--json", "--limit", "1000")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    data["summary"].pop("oldest_age_ms")
    for m in data["messages"]:
        m.pop("age_ms")
    return data


def last_snapshot_offset(log: Path) -> int:
    found = re.findall(r"snapshot of shard 0 at journal offset (\d+)", log.read_text())
    return int(found[-1]) if found else -1


def kill_9(serve: ServeProcess) -> None:
    assert serve.proc is not None
    serve.proc.send_signal(signal.SIGKILL)
    serve.proc.wait(10)


def serving(bootstrap: str, tmp_path: Path, stem: str,
            extra: str = "") -> tuple[str, str, Path, ServeProcess]:
    """A fresh prefix and topic, one queue on it, snapshots every 2 s, `kq serve` started:
    (uid, queue, config, the service)."""
    u = uid()
    name = f"{stem}_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                       extra=extra, service=SNAPSHOTS)
    return u, name, cfg, ServeProcess(cfg, tmp_path / "serve.log").start()


def acks_then_snapshot(bootstrap: str, cfg: Path, serve: ServeProcess, c: QueueClient,
                       name: str, published: int, taken: int, acked: int) -> tuple[list, int]:
    """Publish, take `taken` and ack `acked` of them, then wait for a snapshot written after
    the acks: (the messages taken, that snapshot's journal offset)."""
    publish(bootstrap, name, [b'{"n": %d}' % i for i in range(published)])
    got = drain(c.subscribe(name, max_backlog=taken), taken)
    c.ack(name, [m.bookmark for m in got[:acked]])
    c.flush()
    wait_for(lambda: inspect(cfg, name)["summary"]["acked"] == acked, what="the acks")
    before = last_snapshot_offset(serve.log_path)
    return got, wait_for(lambda: (o := last_snapshot_offset(serve.log_path)) > before and o,
                         timeout=20, what="a snapshot after the acks")


def test_a_restore_after_retention_deleted_the_journals_head_loads_the_snapshot(
        kafka_bootstrap, tmp_path):
    u, name, cfg, serve = serving(kafka_bootstrap, tmp_path, "RET", 'lease_period = "1h"\n')
    try:
        with QueueClient(kafka_bootstrap, name=f"w-{u}", topic_prefix=f"kq{u}") as c:
            got, snapshot_at = acks_then_snapshot(kafka_bootstrap, cfg, serve, c, name,
                                                  published=30, taken=10, acked=6)
            publish(kafka_bootstrap, name, [b'{"n": %d}' % i for i in range(30, 35)])
            wait_for(lambda: inspect(cfg, name)["summary"]["depth"] == 29, what="5 more")
            before = inspect(cfg, name)
            kill_9(serve)  # no snapshot at the stop: the 5 are only in the journal's tail
            # retention takes everything the snapshot reflects
            delete_before(kafka_bootstrap, f"kq{u}.journal", snapshot_at + 1)
            shutil.rmtree(tmp_path / "state")
            serve.start()
            assert inspect(cfg, name) == before
            log = serve.log_path.read_text()
            assert f"journal offset {snapshot_at}); replaying the journal after it" in log \
                or "loaded snapshot" in log
            assert "rebuilding every queue from the journal" not in log
            # the leases held before are still this client's: its acks settle them
            c.ack(name, [m.bookmark for m in got[6:]])
            c.flush()
            wait_for(lambda: inspect(cfg, name)["summary"]["acked"] == 10, what="4 more acks")
    finally:
        serve.stop()


def test_a_journal_missing_its_head_and_no_snapshot_is_refused_naming_both(
        kafka_bootstrap, tmp_path):
    u, name, cfg, serve = serving(kafka_bootstrap, tmp_path, "RETNO")
    publish(kafka_bootstrap, name, [b'{"n": %d}' % i for i in range(5)])
    wait_for(lambda: inspect(cfg, name)["summary"]["depth"] == 5, what="5 queued")
    serve.stop()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([f"kq{u}.snapshots"])[f"kq{u}.snapshots"].result(30)
    delete_before(kafka_bootstrap, f"kq{u}.journal", 2)
    shutil.rmtree(tmp_path / "state")
    serve.start(wait_ready=False)
    assert serve.wait_exit(60) != 0
    log = " ".join(serve.log_path.read_text().split())  # the error is wrapped to the width
    assert (f"shard 0 cannot be restored: its journal kq{u}.journal starts at offset 2 "
            "(retention deleted the records before), there is no local state") in log
    assert "holds no complete snapshot" in log


def test_a_journal_that_could_delete_what_a_restore_needs_is_refused(kafka_bootstrap,
                                                                    tmp_path):
    u = uid()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    journal = f"kq{u}.journal"
    admin.create_topics([NewTopic(journal, 1, 1, config={"retention.bytes": "100000"})]
                        )[journal].result(30)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [f"Q_{u}"], tmp_path / "state",
                       kafka_bootstrap, service=SNAPSHOTS)
    got = kq("serve", "--config", str(cfg), timeout=60)
    assert got.returncode == 2, got.stderr
    said = " ".join((got.stdout + got.stderr).split())
    assert f"the journal topic {journal}: retention.bytes = 100000" in said
    assert "snapshot_interval = 2s, so it must keep at least 4s" in said
    # kq sets the retention it is configured with on a journal it did not make
    fine = f"kq{u}b.journal"
    admin.create_topics([NewTopic(fine, 1, 1, config={"retention.ms": "-1"})])[fine].result(30)
    write_config(cfg, f"kq{u}b", [f"Q_{u}"], tmp_path / "state-b", kafka_bootstrap,
                 service=SNAPSHOTS)
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    serve.stop()
    resource = ConfigResource(ResourceType.TOPIC, fine)
    assert admin.describe_configs([resource])[resource].result(10)["retention.ms"].value \
        == "3600000"
    assert "retention.ms -1 -> 3600000" in serve.log_path.read_text()


def test_records_deleted_by_retention_before_kq_read_them_are_counted_and_logged(
        kafka_bootstrap, tmp_path):
    u, name, cfg, serve = serving(kafka_bootstrap, tmp_path, "LOSS")
    try:
        publish(kafka_bootstrap, name, [b'{"n": %d}' % i for i in range(5)])
        wait_for(lambda: inspect(cfg, name)["summary"]["depth"] == 5, what="5 queued")
        serve.stop()
        publish(kafka_bootstrap, name, [b'{"n": %d}' % i for i in range(5, 15)])
        delete_before(kafka_bootstrap, name, 12)  # 5..11 go before kq reads them
        serve.start()
        wait_for(lambda: inspect(cfg, name)["summary"]["depth"] == 8, what="3 more queued")
        log = serve.log_path.read_text()
        assert (f"{name}/0: 7 record(s) at offsets 5 to 11 were deleted by the topic's "
                "retention before kq read them") in log
        with QueueClient(kafka_bootstrap, topic_prefix=f"kq{u}") as c:
            got = drain(c.subscribe(name, max_backlog=10), 8)
        assert sorted(int(m.bookmark.rsplit("/", 1)[1]) for m in got) == \
            [0, 1, 2, 3, 4, 12, 13, 14]
    finally:
        serve.stop()


def test_journal_commands_and_the_audit_answer_from_what_retention_left(kafka_bootstrap,
                                                                       tmp_path):
    u, name, cfg, serve = serving(kafka_bootstrap, tmp_path, "RETJ", 'lease_period = "1h"\n')
    try:
        with QueueClient(kafka_bootstrap, name=f"w-{u}", topic_prefix=f"kq{u}") as c:
            got, snapshot_at = acks_then_snapshot(kafka_bootstrap, cfg, serve, c, name,
                                                  published=10, taken=6, acked=4)
            publish(kafka_bootstrap, name, [b'{"n": %d}' % i for i in range(10, 13)])
            got[4].ack()  # after the snapshot: in the journal's tail only
            c.flush()
            wait_for(lambda: inspect(cfg, name)["summary"]["acked"] == 5, what="one more ack")
            delete_before(kafka_bootstrap, f"kq{u}.journal", snapshot_at + 1)

            dump = kq("journal", "dump", "--config", str(cfg), "--json")
            assert dump.returncode == 0, dump.stderr
            assert f"kq{u}.journal holds its records from" in " ".join(dump.stderr.split())
            rows = [json.loads(line) for line in dump.stdout.splitlines()]
            assert rows and min(r["offset"] for r in rows) > snapshot_at
            assert sorted(r["kind"] for r in rows if r["queue"] == name
                          and r["kind"] in ("enqueued", "acked")) == ["acked"] + ["enqueued"] * 3

            audit = kq("journal", "audit", "--config", str(cfg), "--json", timeout=300)
            assert audit.returncode == 0, audit.stdout + audit.stderr
            result = json.loads(audit.stdout)
            assert result["differences"] == []
            # the newest snapshot the journal continues (more are written meanwhile)
            assert result["snapshots"][0]["journal_offset"] >= snapshot_at
            assert result["messages"] == 8  # 13 published, 5 acked
            assert "audited from snapshot" in " ".join(audit.stderr.split())

            report = kq("journal", "report", "--out", str(tmp_path / "report"), "--config",
                        str(cfg), "--json", timeout=300)
            assert report.returncode == 0, report.stderr
            totals = json.loads(report.stdout)["queues"][name]
            assert (totals["enqueued"], totals["acked"]) == (3, 1)  # exactly the retained span
            assert "holds its records from" in report.stderr
    finally:
        serve.stop()


def test_a_read_whose_journal_retention_deleted_meanwhile_is_called_incomplete(kafka_bootstrap,
                                                                            tmp_path):
    """Retention deleting journal records an audit still needed while it read them (a
    journal kept for less than a read takes): the audit must fail naming it, not report
    the differences a partial journal makes."""
    from broker.config import load_config
    from broker.history.snapshot_base import deleted_while_read
    from broker.kafka import clients

    prefix = f"dw{uid()}"
    cfg = load_config(write_config(tmp_path / "kq.toml", prefix, ["Q"], tmp_path / "s",
                                   kafka_bootstrap))
    journal = f"{prefix}.journal"
    ensure_topic(kafka_bootstrap, journal, partitions=2)
    publish(kafka_bootstrap, journal, [b"part"] * 10, key=b"k")  # one partition: shard 1
    c = clients.consumer(kafka_bootstrap)
    try:
        shard = next(p for p in (0, 1) if clients.watermarks(c, journal, p)[1] == 10)
        base = {shard: {"after_offset": 3}}
        assert deleted_while_read(c, cfg, [0, 1], base) is None
        delete_before(kafka_bootstrap, journal, 4, partition=shard)  # just what it needs
        assert deleted_while_read(c, cfg, [0, 1], base) is None
        delete_before(kafka_bootstrap, journal, 6, partition=shard)
        problem = deleted_while_read(c, cfg, [0, 1], base)
        assert problem is not None and f"{journal} partition {shard} up to offset 6" in problem
        assert "from offset 4" in problem and "journal_retention" in problem
        # a shard audited from the journal's start needs all of it
        assert "from offset 0" in (deleted_while_read(c, cfg, [shard], {}) or "")
    finally:
        c.close()
