"""kill -9 while a snapshot is written (broker.service.snapshots): after its first chunk, and
after its `complete` record but before the snapshots it replaces are deleted. Then the
data_dir is lost too, so the restore must come from Kafka: nothing is lost, and the next
snapshot deletes whatever the cut-short one left behind."""

import json
import re
import shutil

import pytest

from broker.client import QueueClient
from broker.kafka import clients
from broker.kafka.ranges import real_ends, records
from broker.state import snapshot as fmt
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

pytestmark = pytest.mark.integration

SIGKILLED = -9


def summary(cfg, name):
    got = kq("inspect", name, "--config", str(cfg), "--json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["summary"]


def snapshots_written(serve):
    return len(re.findall(r"snapshot of shard 0 at journal offset", serve.log_path.read_text()))


def live_keys(bootstrap, topic):
    """The keys of the snapshot partition whose latest record is not a tombstone, and the
    survey of all its records."""
    c = clients.consumer(bootstrap)
    try:
        (low, end), = real_ends(c, [(topic, 0)]).values()
        recs = [(r.offset(), r.key(), r.value()) for r in records(c, topic, 0, low, end)]
    finally:
        c.close()
    latest = {}
    for _, key, value in recs:
        latest[key] = value
    return {k for k, v in latest.items() if v is not None}, fmt.survey(0, recs)


@pytest.mark.parametrize("point", ["chunks", "complete"])
def test_a_kill_9_while_writing_a_snapshot_loses_nothing(bootstrap, tmp_path, point):
    u = uid()
    name = f"SNAPKILL_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap,
                       extra='lease_period = "1h"\n',
                       service='snapshot_interval = "2s"\njournal_retention = "1h"')
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        publish(bootstrap, name, [b'{"n": %d}' % i for i in range(20)])
        with QueueClient(bootstrap, topic_prefix=f"kq{u}") as c:
            got = drain(c.subscribe(name, max_backlog=5), 5)
            c.ack(name, [m.bookmark for m in got[:2]])
            c.flush()
        wait_for(lambda: summary(cfg, name)["acked"] == 2, what="the acks")
        serve.stop()  # writes a snapshot: the one the crashed write must not spoil
        publish(bootstrap, name, [b'{"n": %d}' % i for i in range(20, 25)])
        serve.start(wait_ready=False, KQ_CRASH_IN_SNAPSHOT=point)
        assert serve.wait_exit() == SIGKILLED
        assert f"KQ_CRASH_IN_SNAPSHOT={point}: killing myself" in serve.log_path.read_text()
        shutil.rmtree(tmp_path / "state")  # and the local state is lost
        written = snapshots_written(serve)
        serve.start()
        wait_for(lambda: summary(cfg, name)["depth"] == 23, what="18 left and 5 more")
        assert summary(cfg, name)["acked"] == 2
        assert "loaded snapshot" in serve.log_path.read_text()
        # the next snapshot deletes the replaced one and what the cut-short write left
        wait_for(lambda: snapshots_written(serve) > written, timeout=20, what="a new snapshot")
        live, seen = live_keys(bootstrap, f"kq{u}.snapshots")
        newest = seen.complete[0].snapshot
        assert live and all(k.startswith(f"0/{newest}/".encode()) for k in live), live
        taken = set()
        with QueueClient(bootstrap, topic_prefix=f"kq{u}") as c:
            for m in c.subscribe(name, max_backlog=10).messages(timeout=10):
                taken.add(m.bookmark)
                m.ack()
                if len(taken) == 23:
                    break
        assert len(taken) == 23
    finally:
        serve.stop()
