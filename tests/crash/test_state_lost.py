"""The RocksDB directory is lost between runs: every queue is rebuilt from Kafka, identically."""

import json
import shutil

import pytest

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


def test_deleting_data_dir_rebuilds_identical_state(bootstrap, tmp_path):
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
            serve.stop()
            shutil.rmtree(tmp_path / "state")
            serve.start()
            after = state_of(cfg, [alo, amo])
            assert after == before
            assert "rebuilding every queue from the journal" in serve.log_path.read_text()
            # Again, killed after the first of its writes (of 5 transitions each) and started
            # again: it carries on from that write, and ends in the same state.
            serve.stop()
            shutil.rmtree(tmp_path / "state")
            serve.start(wait_ready=False, KQ_TEST_REPLAY_CHUNK="5", KQ_CRASH_IN_REPLAY="1")
            assert serve.wait_exit() == -9
            serve.start()
            assert state_of(cfg, [alo, amo]) == before
        log = serve.log_path.read_text()
        assert log.count("rebuilding every queue from the journal") == 2  # not a third time
        assert "KQ_CRASH_IN_REPLAY: killing myself" in log
    finally:
        serve.stop()
