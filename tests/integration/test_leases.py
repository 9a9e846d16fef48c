"""SPEC sections 6-7 end to end: the real service, the real client, a real broker."""

import signal
import threading
import time

import pytest

from broker import wire
from broker.client import CommandError, QueueClient
from tests.integration.kit import (
    config,
    drain,
    ensure_topic,
    publish,
    read_topic,
    running_service,
    serving_one_queue,
    uid,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_every_message_field_is_filled_and_acks_free_the_backlog(bootstrap, world):
    with world.start(), world.client(name=f"w-{uid()}") as c:
        sub = c.subscribe(world.topic, max_backlog=2)
        bms = publish(bootstrap, world.topic, [b'{"sym": "IBM", "n": 1}', b'{"n": 2}',
                                               b'{"n": 3}'], key=b"k1",
                      headers=[("trace", b"abc")])
        first = drain(sub, 2)
        assert [m.bookmark for m in first] == bms[:2]  # oldest first
        m = first[0]
        assert m.queue == world.topic and m.data == {"sym": "IBM", "n": 1}
        assert m.value == b'{"sym": "IBM", "n": 1}' and m.key == b"k1"
        assert ("trace", b"abc") in m.headers
        assert m.delivery_count == 1 and m.is_barrier is False
        assert time.time() + 50 < m.lease_deadline < time.time() + 61
        assert drain(sub, 1, timeout=0.5) == []  # backlog of 2 is full
        m.ack()
        (third,) = drain(sub, 1)
        assert third.bookmark == bms[2]


def test_lapsed_lease_is_delivered_again_with_a_higher_count(bootstrap, world):
    with world.start(lease_period="1s"), world.client() as c:
        sub = c.subscribe(world.topic)
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        (m1,) = drain(sub, 1)
        (m2,) = drain(sub, 1, timeout=5)  # not acked: it comes back after the lease
        assert (m1.bookmark, m1.delivery_count) == (bm, 1)
        assert (m2.bookmark, m2.delivery_count) == (bm, 2)


def test_cancel_returns_and_max_cancels_dead_letters_with_reason(bootstrap, world):
    dlq = f"DLQ_{uid()}"
    with world.start(max_cancels=1, dead_letter_topic=dlq), world.client() as c:
        sub = c.subscribe(world.topic)
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        (m,) = drain(sub, 1)
        m.cancel()
        (again,) = drain(sub, 1)
        assert again.delivery_count == 2
        again.cancel()  # cancel count 2 > 1: expired
        assert drain(sub, 1, timeout=1) == []
        (dead,) = read_topic(bootstrap, dlq, 1)
        headers = dict(dead.headers())
        assert headers["kq-reason"] == b"max-cancels"
        assert headers["kq-bookmark"] == bm.encode()
        assert dead.value() == b'{"n": 1}'


def test_max_deliveries_and_expire_request_dead_letter(bootstrap, world):
    dlq = f"DLQ_{uid()}"
    with world.start(max_deliveries=1, lease_period="500ms", dead_letter_topic=dlq), \
            world.client() as c:
        sub = c.subscribe(world.topic)
        publish(bootstrap, world.topic, [b'{"n": 1}', b'{"n": 2}'])
        (m1,) = drain(sub, 1)  # left to lapse: delivered once, so removed
        (m2,) = drain(sub, 1, timeout=5)
        m2.expire()
        reasons = sorted(dict(r.headers())["kq-reason"] for r in read_topic(bootstrap, dlq, 2))
        assert reasons == [b"expire-requested", b"max-deliveries"]


def test_expiration_removes_old_messages(bootstrap, world):
    dlq = f"DLQ_{uid()}"
    with world.start(expiration="500ms", dead_letter_topic=dlq), world.client() as c:
        publish(bootstrap, world.topic, [b'{"old": true}'])
        (dead,) = read_topic(bootstrap, dlq, 1)
        assert dict(dead.headers())["kq-reason"] == b"expired"
        sub = c.subscribe(world.topic)
        assert drain(sub, 1, timeout=0.5) == []


def test_closing_a_subscription_returns_its_leases_at_once(bootstrap, world):
    with world.start(), world.client() as c1, world.client() as c2:
        s1 = c1.subscribe(world.topic)
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        (m,) = drain(s1, 1)
        s2 = c2.subscribe(world.topic)
        s1.close()
        (again,) = drain(s2, 1, timeout=5)
        assert (again.bookmark, again.delivery_count) == (bm, 2)


def test_a_silent_subscriber_loses_its_leases(bootstrap, world):
    world.state["service"] = {"heartbeat_timeout": "1s"}
    with world.start(), world.client(heartbeat_interval=3600) as silent, world.client() as live:
        s1 = silent.subscribe(world.topic)
        silent._heartbeat_s = 3600  # the reply asked for faster beats; keep this one silent
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        drain(s1, 1)
        s2 = live.subscribe(world.topic)
        (again,) = drain(s2, 1, timeout=10)
        assert (again.bookmark, again.delivery_count) == (bm, 2)


def _mute_heartbeats(client):
    """Make the client's heartbeats vanish while the returned event is set (a worker
    starved of CPU, or cut off for a while)."""
    muted = threading.Event()
    send = client._send

    def send_unless_muted(records):
        if muted.is_set():  # (the core's own methods cannot be wrapped when it is compiled)
            records = [r for r in records if wire.decode("command", r.value)["kind"] != "heartbeat"]
        send(records)

    client._send = send_unless_muted
    return muted


def test_a_subscriber_dropped_for_silence_is_told_and_subscribes_again(bootstrap, world):
    world.state["service"] = {"heartbeat_timeout": "1s"}
    with world.start() as service, world.client() as c:
        sub = c.subscribe(world.topic)
        bms = publish(bootstrap, world.topic, [b'{"n": 1}', b'{"n": 2}'])
        (m,) = drain(sub, 1)
        muted = _mute_heartbeats(c)
        muted.set()
        wait_for(lambda: sub.sub_id not in service.engine.subs, 10, "the service to drop it")
        muted.clear()
        again = drain(sub, 1)  # reads the notice; the subscription is made again
        assert [(x.bookmark, x.delivery_count) for x in again] == [(bms[0], 2)]
        again[0].ack()
        (nxt,) = drain(sub, 1)
        assert nxt.bookmark == bms[1] and sub.sub_id in service.engine.subs


def test_a_subscription_the_service_lost_without_a_word_is_made_again(bootstrap, world):
    with world.start() as service, world.client() as c:
        sub = c.subscribe(world.topic)
        c._send(c.core.command("unsubscribe", sub_id=sub.sub_id))  # gone, no notice said so
        wait_for(lambda: sub.sub_id not in service.engine.subs, 10, "the unsubscribe")
        # the next heartbeat is answered "no subscriptions here", and it subscribes again
        (bm,) = publish(bootstrap, world.topic, [b'{"n": 1}'])
        (m,) = drain(sub, 1)
        assert m.bookmark == bm


def test_a_subscription_that_cannot_be_made_again_raises(bootstrap, world, tmp_path):
    other = f"O_{uid()}"
    ensure_topic(bootstrap, other)
    with world.client() as c:
        with world.start():
            sub = c.subscribe(world.topic)
        # the service comes back without the queue: subscribing again is refused
        cfg = config(world.prefix, str(tmp_path), [{"name": other}])
        with (running_service(bootstrap, cfg),
              pytest.raises(CommandError, match=f"unknown queue '{world.topic}'")):
            drain(sub, 1, timeout=10)


def test_batch_ack_and_refusals_raise_command_error(bootstrap, world):
    with world.start(), world.client() as c:
        sub = c.subscribe(world.topic, max_backlog=3)
        publish(bootstrap, world.topic, [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'])
        got = drain(sub, 3)
        c.ack(world.topic, [m.bookmark for m in got])
        with pytest.raises(CommandError, match="already acked"):
            c.ack(world.topic, [got[0].bookmark])
        with pytest.raises(CommandError, match="unknown queue 'NOPE'"):
            c.subscribe("NOPE")
        with pytest.raises(CommandError, match="max_backlog must be >= 0"):
            c.subscribe(world.topic, max_backlog=-1)


def test_at_most_once_is_never_redelivered(bootstrap, world):
    with world.start(semantics="at-most-once", lease_period="500ms"), world.client() as c:
        sub = c.subscribe(world.topic, max_backlog=1)
        bms = publish(bootstrap, world.topic, [b'{"n": 1}', b'{"n": 2}'])
        (m1,) = drain(sub, 1)
        assert m1.lease_deadline is None
        m1.ack()  # frees the backlog
        (m2,) = drain(sub, 1)
        # m2 is never acked: its slot frees after the lease period, but it never comes back
        assert [m1.bookmark, m2.bookmark] == bms
        assert drain(sub, 1, timeout=1.5) == []


def test_round_robin_alternates_between_subscribers(bootstrap, world):
    with world.start(fairness="round-robin"), world.client() as c1, world.client() as c2:
        s1 = c1.subscribe(world.topic, max_backlog=10)
        s2 = c2.subscribe(world.topic, max_backlog=10)
        bms = publish(bootstrap, world.topic, [b'{"n": %d}' % i for i in range(6)])
        a = [m.bookmark for m in drain(s1, 3)]
        b = [m.bookmark for m in drain(s2, 3)]
        assert a == bms[0::2] and b == bms[1::2]


def test_subscribers_and_depth_are_visible_while_serving(bootstrap, world):
    with world.start() as service, world.client(name=f"seen-{uid()}") as c:
        c.subscribe(world.topic, max_backlog=2)
        publish(bootstrap, world.topic, [b"{}"] * 3)
        rows = wait_for(lambda: [r for r in c.query(what="queues")["queues"]
                                 if r["leased"] == 2], what="two leased")
        assert rows[0]["depth"] == 3 and rows[0]["available"] == 1
        subs = c.query(what="subscribers", queue=world.topic)["subscribers"]
        assert [(s["client"], s["leased"], s["backlog"]) for s in subs] == [(c.name, 2, 2)]
        assert service.engine.queues[world.topic].depth() == 3


def test_two_live_processes_with_one_client_name_are_both_told(world):
    world.state["service"] = {"heartbeat_timeout": "2s"}  # heartbeats every 0.5 s
    name = f"w-{uid()}"
    with world.start(), world.client(name=name) as one, world.client(name=name) as other:
        one.subscribe(world.topic)
        other.subscribe(world.topic)
        for c in (one, other):
            wait_for(lambda c=c: any("another live process uses the client name" in e
                                     for e in c.errors), timeout=20, what="the name-in-use notice")


def test_a_service_frozen_past_the_heartbeat_timeout_keeps_its_live_clients(bootstrap, tmp_path):
    """kill -STOP of an idle `kq serve` for longer than heartbeat_timeout, its client
    heartbeating all along (the heartbeats wait unread in Kafka): woken, the service must
    not take that for silence. It did, dropping the client and taking its lease back: an
    idle service is frozen inside its poll's wait, and only a freeze between two turns of
    its loop was allowed for."""
    with serving_one_queue(bootstrap, tmp_path, "FROZEN", service='heartbeat_timeout = "3s"\n'
                           'session_timeout = "30s"') as (name, _, prefix, serve):
        publish(bootstrap, name, [b'{"n": 1}'])
        with QueueClient(bootstrap, topic_prefix=prefix) as client:
            (msg,) = drain(client.subscribe(name, max_backlog=1), 1)
            assert serve.proc is not None
            serve.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(7)  # the freeze itself: past the 3 s heartbeat timeout
            finally:
                serve.proc.send_signal(signal.SIGCONT)
            # read after the woken service's first turn, where the drop would have been
            msg.ack(wait=True)  # LeaseLost if the lease was taken back
            assert not client.errors
