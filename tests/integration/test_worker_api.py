"""Long jobs and clean stops (SPEC 7) end to end: lease renewal, late acks refused and never
applied to a later delivery, waiting for ever, subscriptions as context managers, the
asyncio client, and `kq worker` stopped by SIGTERM."""

import asyncio
import os
import signal
import subprocess
import threading
import time

import pytest

from broker import wire
from broker.client import AsyncQueueClient, LeaseLost, QueueClient
from broker.errors import KqError
from tests.integration.kit import (
    KQ,
    ROOT,
    ServeProcess,
    drain,
    ensure_topic,
    publish,
    read_topic,
    uid,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


def test_an_ack_after_the_lapse_is_refused_and_reported_and_the_next_delivery_is_kept(
        bootstrap, world):
    refusals: list[str] = []
    with world.start(lease_period="2s"), world.client(on_refused=refusals.append) as c:
        sub = c.subscribe(world.topic)
        (bm,) = publish(bootstrap, world.topic, [b'{"job": 1}'])
        (first,) = drain(sub, 1)
        (second,) = drain(sub, 1)  # the lease lapsed unanswered: delivered again
        assert (second.bookmark, second.delivery_count) == (bm, 2)
        first.ack()  # the late ack of delivery 1
        c.flush()
        wait_for(lambda: refusals, 10, "the refusal of the late ack")
        assert "lease lost" in refusals[0] and c.errors == refusals
        with pytest.raises(LeaseLost, match="delivery 1 of it is over"):
            first.ack(wait=True)
        second.ack(wait=True)  # its own ack is applied: the message is done
        assert drain(sub, 1, timeout=3) == []


def test_extend_keeps_the_lease_past_the_lease_period(bootstrap, world):
    with world.start(lease_period="2s"), world.client() as c, world.client() as other:
        sub = c.subscribe(world.topic)
        (bm,) = publish(bootstrap, world.topic, [b'{"job": "long"}'])
        (msg,) = drain(sub, 1)
        deadline = msg.extend("30s")
        assert deadline == msg.lease_deadline and deadline > time.time() + 25
        watcher = other.subscribe(world.topic)
        # past the lease period (2 s) nobody gets it again
        assert drain(watcher, 1, timeout=4) == [] and drain(sub, 1, timeout=0.5) == []
        msg.ack(wait=True)
        assert msg.delivery_count == 1


def test_extend_after_the_lapse_raises_lease_lost(bootstrap, world):
    with world.start(lease_period="1s"), world.client() as c:
        sub = c.subscribe(world.topic)
        publish(bootstrap, world.topic, [b'{"job": 1}'])
        (first,) = drain(sub, 1)
        (again,) = drain(sub, 1)
        assert again.delivery_count == 2
        with pytest.raises(LeaseLost):
            first.extend("30s")
        again.ack(wait=True)


def test_messages_without_timeout_waits_until_the_subscription_closes(bootstrap, world):
    with world.start(), world.client() as c:
        sub = c.subscribe(world.topic)
        seen, ended = [], threading.Event()

        def read() -> None:
            for msg in sub.messages(timeout=None):
                seen.append(msg)
                msg.ack()
            ended.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert not ended.wait(6)  # past the default timeout of 5 s: still waiting
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        wait_for(lambda: seen, 10, "the message")
        sub.close()
        assert ended.wait(5) and [m.bookmark for m in seen] == [bm]


def test_leaving_a_subscriptions_with_block_returns_its_leases_at_once(bootstrap, world):
    world.state["service"] = {"heartbeat_timeout": "60s"}
    with world.start(), world.client() as c, world.client() as other:
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        with c.subscribe(world.topic) as sub:
            (held,) = drain(sub, 1)
        started = time.monotonic()
        (again,) = drain(other.subscribe(world.topic), 1, timeout=10)
        assert (again.bookmark, again.delivery_count) == (bm, 2)
        assert time.monotonic() - started < 10  # not after the 60 s heartbeat timeout


def test_the_async_client_leases_extends_acks_and_refuses_late_acks(bootstrap, world):
    async def work() -> list[int]:
        async with AsyncQueueClient(bootstrap, topic_prefix=world.prefix) as c:
            sub = await c.subscribe(world.topic, max_backlog=2)
            publish(bootstrap, world.topic, [b'{"n": 1}', b'{"n": 2}'])
            got = []
            async for msg in sub.messages(timeout=10):
                got.append(msg)
                if len(got) == 2:
                    break
            assert await got[0].extend("30s") > time.time() + 25
            await got[0].ack(wait=True)
            # got[1]'s lease (2 s) lapsed: delivered again
            again = await anext(aiter(sub.messages(timeout=10)))
            with pytest.raises(LeaseLost):
                await got[1].ack(wait=True)
            await again.ack()
            await c.flush()
            async with sub:
                pass
            return [m.delivery_count for m in (*got, again)]

    with world.start(lease_period="2s"):
        assert asyncio.run(asyncio.wait_for(work(), 60)) == [1, 1, 2]


HANDLER = '''
import pathlib, time
OUT = pathlib.Path({out!r})

def handle(msg):
    if msg.data.get("slow"):
        (OUT / "slow-started").write_text(msg.bookmark)
        time.sleep(600)
    (OUT / msg.bookmark.replace("/", "_")).write_text(str(msg.delivery_count))

async def handle_async(msg):
    handle(msg)
'''


@pytest.mark.parametrize("function", ["handle", "handle_async"])
def test_kq_worker_handles_messages_and_stops_on_sigterm_returning_leases(
        bootstrap, tmp_path, function):
    u = uid()
    topic, out = f"W_{u}", tmp_path / "out"
    out.mkdir()
    (tmp_path / f"jobs_{u}.py").write_text(HANDLER.format(out=str(out)))
    cfg = write_config(tmp_path / "kq.toml", f"kqw{u}", [topic], tmp_path / "state", bootstrap,
                       service='heartbeat_timeout = "60s"')
    ensure_topic(bootstrap, topic)
    serve = ServeProcess(cfg, tmp_path / "serve.log").start()
    try:
        bms = publish(bootstrap, topic, [b'{"n": %d}' % i for i in range(10)])
        worker = subprocess.Popen(
            [*KQ, "worker", f"jobs_{u}:{function}", "--queue", topic,
             "--concurrency", "3", "--grace", "2s", "--config", str(cfg)],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_for(lambda: all((out / b.replace("/", "_")).exists() for b in bms), 60,
                 "every message handled")
        (slow,) = publish(bootstrap, topic, [b'{"slow": true}'])
        wait_for(lambda: (out / "slow-started").exists(), 30, "the slow job to start")
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(30)
        took = time.monotonic() - stopped_at
        log = worker.stdout.read() if worker.stdout else ""
        # the slow handler outlived the 2 s grace: exit 1, within the grace and a close
        assert code == 1 and took < 15, log
        assert "still running after the grace" in log
        with QueueClient(bootstrap, topic_prefix=f"kqw{u}") as c:
            started = time.monotonic()
            (again,) = drain(c.subscribe(topic), 1, timeout=15)
            assert (again.bookmark, again.delivery_count) == (slow, 2)
            assert time.monotonic() - started < 15  # at once, not after 60 s
            again.ack(wait=True)
    finally:
        serve.stop()


def test_a_client_of_a_prefix_no_service_used_is_refused_at_once(bootstrap):
    prefix = f"none{uid()}"
    for subscribe in (lambda: sync_subscribe(bootstrap, prefix),
                      lambda: asyncio.run(async_subscribe(bootstrap, prefix))):
        started = time.monotonic()
        with pytest.raises(KqError, match=f"no kq service has run with topic prefix '{prefix}'"):
            subscribe()
        # not the 10 s request timeout, nor a close's 5 s flush to a topic that is not there
        assert time.monotonic() - started < 5


def sync_subscribe(bootstrap: str, prefix: str) -> None:
    with QueueClient(bootstrap, topic_prefix=prefix) as c:
        c.subscribe("Q")


async def async_subscribe(bootstrap: str, prefix: str) -> None:
    async with AsyncQueueClient(bootstrap, topic_prefix=prefix) as c:
        await c.subscribe("Q")


def test_kq_worker_stopped_while_its_subscribe_waits_for_a_service_exits_at_once(
        bootstrap, tmp_path):
    u = uid()
    (tmp_path / f"jobs_{u}.py").write_text("def handle(msg):\n    pass\n")
    cfg = write_config(tmp_path / "kq.toml", f"kqs{u}", ["Q"], tmp_path / "state", bootstrap)
    ensure_topic(bootstrap, f"kqs{u}.commands")  # a service ran once; none runs now
    worker = subprocess.Popen([*KQ, "worker", f"jobs_{u}:handle", "--queue", "Q", "--config",
                               str(cfg)], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        read_topic(bootstrap, f"kqs{u}.commands", 1, timeout=30)  # its subscribe went out
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGINT)
        code = worker.wait(30)
        log = worker.stdout.read() if worker.stdout else ""
        assert code == 0, log
        assert time.monotonic() - stopped_at < 5, log  # not the 10 s request timeout
        assert "stopped before the subscription was made" in log
        # it closed: its close command followed the subscribe
        sent = [wire.decode("command", r.value())["type"]
                for r in read_topic(bootstrap, f"kqs{u}.commands", 2)]
        assert sent == ["subscribe", "close"]
    finally:
        worker.kill()


def test_kq_worker_names_a_handler_it_cannot_load(tmp_path):
    run = subprocess.run([*KQ, "worker", "no_such_module:f", "--queue", "Q",
                          "-b", "127.0.0.1:1"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert run.returncode == 2
    assert "cannot import 'no_such_module'" in run.stderr
