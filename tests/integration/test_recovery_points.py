"""Recovery points: where a queue starts, how it moves, and what a change of it does."""

import json
import time
from datetime import UTC, datetime

import pytest

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

pytestmark = pytest.mark.integration


@pytest.fixture
def rig(bootstrap, tmp_path):
    u = uid()
    name = f"RP_{u}"
    ensure_topic(bootstrap, name)

    class Rig:
        prefix = f"kq{u}"
        cfg = tmp_path / "kq.toml"
        serve = ServeProcess(tmp_path / "kq.toml", tmp_path / "serve.log")

        def configure(self, extra: str = "") -> None:
            write_config(self.cfg, self.prefix, [name], tmp_path / "state", bootstrap, extra)

        def bookmarks(self) -> list[str]:
            out = kq("inspect", name, "--config", str(self.cfg), "--json")
            assert out.returncode == 0, out.stderr + self.serve.log_path.read_text()[-3000:]
            return [m["bookmark"] for m in json.loads(out.stdout)["messages"]]

    r = Rig()
    r.name = name
    yield r
    r.serve.stop()


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def test_latest_starts_with_what_is_published_after_the_queue_appears(bootstrap, rig):
    publish(bootstrap, rig.name, [b'{"old": 1}', b'{"old": 2}'])
    rig.configure('recovery_point = "latest"\n')
    rig.serve.start()
    (new,) = publish(bootstrap, rig.name, [b'{"new": 1}'])
    assert wait_for(lambda: rig.bookmarks() == [new], what="only the new message")
    rig.serve.stop()
    rig.serve.start()  # "latest" was resolved once: a restart does not move it
    publish(bootstrap, rig.name, [b'{"new": 2}'])
    assert wait_for(lambda: len(rig.bookmarks()) == 2, what="both new messages")


def test_iso_time_and_a_changed_recovery_point_restart_the_queue(bootstrap, rig):
    (first,) = publish(bootstrap, rig.name, [b'{"n": 1}'])
    time.sleep(0.05)
    between = int(time.time() * 1000)
    time.sleep(0.05)
    (second,) = publish(bootstrap, rig.name, [b'{"n": 2}'])
    rig.configure()  # earliest
    rig.serve.start()
    assert wait_for(lambda: rig.bookmarks() == [first, second], what="both messages")
    rig.serve.stop()
    rig.configure(f'recovery_point = "{iso(between)}"\n')
    rig.serve.start()
    assert wait_for(lambda: rig.bookmarks() == [second], what="the queue restarted at the time")
    assert "recovery point changed" in rig.serve.log_path.read_text()
    rig.serve.stop()
    rig.configure('recovery_point = "earliest"\n')
    rig.serve.start()
    assert wait_for(lambda: rig.bookmarks() == [first, second], what="back to the beginning")


def test_the_recovery_point_moves_forward_as_acks_arrive(bootstrap, rig):
    rig.configure()
    rig.serve.start()
    bms = publish(bootstrap, rig.name, [b'{"n": %d}' % i for i in range(3)])

    def point() -> int:
        out = kq("recovery-points", "--config", str(rig.cfg), "--json")
        assert out.returncode == 0, out.stderr
        rows = [r for r in json.loads(out.stdout) if r["queue"] == rig.name]
        return rows[0]["offset"] if rows else -1

    wait_for(lambda: point() == 0, what="recovery point 0")
    with QueueClient(bootstrap, topic_prefix=rig.prefix) as c:
        sub = c.subscribe(rig.name, max_backlog=3)
        got = drain(sub, 3)
        c.ack(rig.name, [got[1].bookmark])  # acking the middle one does not move it
        assert point() == 0
        c.ack(rig.name, [got[0].bookmark])
        assert point() == 2
        c.ack(rig.name, [got[2].bookmark])
        assert point() == 3
    assert [m.bookmark for m in got] == bms
    table = kq("recovery-points", "--config", str(rig.cfg))
    assert rig.name in table.stdout and table.returncode == 0
