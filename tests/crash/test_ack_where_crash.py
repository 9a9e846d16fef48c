"""An ack by filter of a deep queue goes a part at a time, between the shard's other work: the
service answers queries while it runs, and a kill -9 half way keeps the parts it finished
(journaled like any other acks); asked again after the restart, it acks the rest."""

import json
import subprocess

import pytest

from broker.client import QueueClient
from broker.engine.acks import SWEEP_PART
from tests.integration.kit import (
    KQ,
    ROOT,
    ServeProcess,
    ensure_topic,
    kq,
    publish,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration

N = 20 * SWEEP_PART  # twenty parts: seconds of work for the service run as Python


def test_an_ack_by_filter_killed_half_way_keeps_its_finished_parts(bootstrap, tmp_path):
    u = uid()
    name = f"SWEEP_{u}"
    ensure_topic(bootstrap, name)
    cfg = write_config(tmp_path / "kq.toml", f"kq{u}", [name], tmp_path / "state", bootstrap)
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    publish(bootstrap, name, [b'{"n": %d}' % i for i in range(N)])
    try:
        with QueueClient(bootstrap, topic_prefix=f"kq{u}", name=f"look-{u}") as c:

            def row() -> dict:
                return next(r for r in c.query(what="queues")["queues"] if r["queue"] == name)

            wait_for(lambda: row()["enqueued"] == N, 60, f"all {N} enqueued")
            ack = subprocess.Popen(
                [*KQ, "ack", name, "--where", "/n >= 0", "--config", str(cfg)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                # answered between the parts, with the acks of those done so far
                wait_for(lambda: 0 < row()["depth"] < N, 60, "a depth half way through the ack")
                half_way = row()["depth"]
                serve.proc.kill()  # kill -9 during the ack
                serve.proc.wait()
            finally:
                ack.kill()
                ack.wait()
            assert half_way > 0, "the ack finished before the kill: make N larger"
            serve.start()
            left = row()["depth"]
            assert 0 < left <= half_way  # what it had answered was journaled before
            out = kq("ack", name, "--where", "/n >= 0", "--config", str(cfg), "--json")
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["acked"] == left
            final = row()
            assert (final["depth"], final["acked"]) == (0, N)  # each acked once, none lost
    finally:
        serve.stop()  # (a killed one: nothing to stop)
