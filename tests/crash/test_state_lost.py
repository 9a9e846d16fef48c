"""The RocksDB directory is lost between runs: every queue is rebuilt from Kafka, identically:
from the newest snapshot and the journal after it, or (no snapshot: a journal written before
kq had them) from the whole journal."""

import json
import shutil

import pytest
from confluent_kafka.admin import AdminClient

from broker.client import QueueClient
from tests.integration.kit import (
    ServeProcess,
    drain,
    ensure_topic,
    kq,
    publish,
    uid,
    write_config,
)

pytestmark = pytest.mark.integration


def state_of(cfg, queues):
    """What `kq inspect --json` says of each queue, without the fields that age with time."""
    out = {}
    for name in queues:
        got = kq("inspect", name, "--config", str(cfg), "--json", "--limit", "1000")
        assert got.returncode == 0, got.stderr
        data = json.loads(got.stdout)
        data["summary"].pop("oldest_age_ms")
        for m in data["messages"]:
            m.pop("age_ms")
        out[name] = data
    return out


def forget_snapshots(bootstrap, prefix):
    """Delete the snapshot topic (kq creates it again, empty)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([f"{prefix}.snapshots"])[f"{prefix}.snapshots"].result(30)


REBUILT = {"snapshot": "loaded snapshot", "journal": "rebuilding every queue from the journal"}
# kill -9 half way through the restore, in the middle of what it writes to RocksDB
CRASH = {"snapshot": {"KQ_CRASH_IN_SNAPSHOT": "load"},
         "journal": {"KQ_TEST_REPLAY_CHUNK": "5", "KQ_CRASH_IN_REPLAY": "1"}}


@pytest.mark.parametrize("source", ["snapshot", "journal"])
def test_deleting_data_dir_rebuilds_identical_state(bootstrap, tmp_path, source):
    u = uid()
    alo, amo = f"LOST_{u}", f"LOSTAMO_{u}"
    for t in (alo, amo):
        ensure_topic(bootstrap, t)
    dlq = f"DLQ_{u}"
    cfg = tmp_path / "kq.toml"
    write_config(cfg, f"kq{u}", [alo], tmp_path / "state", bootstrap,
                 extra=f'lease_period = "1h"\nmax_cancels = 1\ndead_letter_topic = "{dlq}"\n'
                       f'[[queue]]\nname = "{amo}"\nsemantics = "at-most-once"\n'
                       f'lease_period = "1h"\n')
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        publish(bootstrap, alo, [b'{"n": %d}' % i for i in range(20)])
        publish(bootstrap, amo, [b'{"n": %d}' % i for i in range(5)])
        with QueueClient(bootstrap, name=f"keeper-{u}", topic_prefix=f"kq{u}") as c:
            got = drain(c.subscribe(alo, max_backlog=8), 8)
            c.ack(alo, [m.bookmark for m in got[:3]])  # 3 acked
            got[3].cancel()  # cancelled once, back in the queue
            got[4].cancel()
            drain(c.subscribe(amo, max_backlog=2), 2)  # 2 sent at most once
            c.flush()
            again = drain(c.subscribe(alo, max_backlog=2), 2)
            for m in again:
                m.cancel()  # a second cancel: above max_cancels, dead-lettered
            c.flush()
            before = state_of(cfg, [alo, amo])
            assert before[alo]["summary"]["acked"] == 3
            states = {m["state"] for q in before.values() for m in q["messages"]}
            assert states == {"available", "leased", "sent"}
            assert any(m["cancel_count"] for m in before[alo]["messages"])
            serve.stop()  # a clean stop writes a snapshot
            shutil.rmtree(tmp_path / "state")
            if source == "journal":
                forget_snapshots(bootstrap, f"kq{u}")
            serve.start()
            after = state_of(cfg, [alo, amo])
            assert after == before
            assert REBUILT[source] in serve.log_path.read_text()
            # Again, killed half way through the restore and started again: it carries on
            # (from the journal: from its last write) and ends in the same state.
            serve.stop()
            shutil.rmtree(tmp_path / "state")
            if source == "journal":
                forget_snapshots(bootstrap, f"kq{u}")
            serve.start(wait_ready=False, **CRASH[source])
            assert serve.wait_exit() == -9
            serve.start()
            assert state_of(cfg, [alo, amo]) == before
        log = serve.log_path.read_text()
        assert log.count(REBUILT[source]) == 2  # not a third time: the crash came first
        assert "killing myself" in log
        assert REBUILT["journal" if source == "snapshot" else "snapshot"] not in log
    finally:
        serve.stop()
