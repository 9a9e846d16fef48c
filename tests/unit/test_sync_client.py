"""The sync client's own threads (broker/client/sync.py), without Kafka."""

import threading

import pytest

from broker.client.core import ClientCore, SubscriptionState
from broker.client.sync import QueueClient


def client_with_a_lost_subscription() -> QueueClient:
    client = QueueClient.__new__(QueueClient)  # no transport: `_subscribe` is replaced
    client.core = ClientCore("w", "w")
    client._closed = threading.Event()
    sub = SubscriptionState("Q", "s1", "queue", {})
    client.core.add(sub)
    sub.lost = "dropped by the service"
    return client


def test_subscribing_again_ends_quietly_when_the_client_is_closed_meanwhile():
    """Closing the client closes its consumer under the thread subscribing again, whose
    wait for the answer then fails: that is the close, not an error to print."""
    client = client_with_a_lost_subscription()

    def closed_midway(sub):
        client._closed.set()
        raise RuntimeError("Consumer closed")

    client._subscribe = closed_midway
    client._subscribe_again()


def test_subscribing_again_still_raises_what_a_close_does_not_explain():
    client = client_with_a_lost_subscription()

    def broken(sub):
        raise RuntimeError("something else")

    client._subscribe = broken
    with pytest.raises(RuntimeError, match="something else"):
        client._subscribe_again()


class Sent:
    """A transport that keeps what the client sends."""

    service_seen = True  # a service runs with the client's prefix

    def __init__(self) -> None:
        self.records: list = []

    def check_service(self) -> None:
        pass

    def shard_count(self) -> int:
        return 1

    def send(self, records) -> None:
        self.records += records


def client_holding_one_message():
    from broker.client.message import batch_of
    client = QueueClient.__new__(QueueClient)  # a transport that keeps what is sent
    client.core = ClientCore("w", "w", owner=client)
    client._io = Sent()
    sub = SubscriptionState("Q", "s1", "queue", {})
    client.core.add(sub)
    client.core.subscribed(sub, {"backlog": 1})
    client.core._deliver("s1", "Q", "json", batch_of([("T/0/0", 1, None, False, 0, None,
                                                         b"{}", [], 0)]))
    return client, sub.buffer[0]


@pytest.mark.parametrize("delay", [-1, "-5s", "soon", float("nan"), float("inf"), 1e17,
                                   "106751980000d"])
def test_a_cancel_with_a_bad_delay_raises_sends_nothing_and_leaves_the_message_unanswered(
        delay):
    """It was sent, refused by the service later (only in `errors`), and the message taken
    for answered: a worker then neither acked nor cancelled it, and it waited out its lease.
    A float the service cannot take (inf) raised OverflowError out of the client."""
    from broker.client import CommandError
    client, msg = client_holding_one_message()
    with pytest.raises(CommandError, match="bad delay"):
        msg.cancel(delay)
    assert client._io.records == [] and not msg.answered
    msg.cancel(0)  # (zero: at once)
    assert len(client._io.records) == 1 and msg.answered


@pytest.mark.parametrize("period", [0, -3, "0s", float("inf"), 1e16])
def test_an_extend_by_nothing_or_less_is_refused_before_it_is_sent(period):
    from broker.client import CommandError
    client, msg = client_holding_one_message()
    with pytest.raises(CommandError, match="bad period"):
        msg.extend(period)
    assert client._io.records == []


def test_one_bookmark_given_alone_is_acked_as_one():
    """`client.ack("Q", "T/0/3")` was read letter by letter: "bad bookmark 'T'"."""
    from broker.client.arguments import bookmark_list
    assert bookmark_list("T/0/3") == ["T/0/3"]
    assert bookmark_list(["T/0/3", "T/0/4"]) == ["T/0/3", "T/0/4"]


def test_after_the_close_every_answer_and_command_raises_saying_the_client_is_closed():
    """An ack after the close was kept and never sent, silently (the lease had gone back
    at the close), and a subscribe or a confirmed ack raised "Consumer closed" from the
    Kafka client."""
    from broker.errors import KqError
    client, msg = client_holding_one_message()
    client._closed = threading.Event()
    client._closed.set()  # what close() sets first, then the core's flag after its commands
    client.core.closed, client.request_timeout = True, 1.0
    for answer in (msg.ack, msg.cancel, msg.expire, lambda: msg.extend("5s"),
                   lambda: msg.ack(wait=True), lambda: client.ack("Q", ["T/0/0"]),
                   lambda: client.subscribe("Q")):
        with pytest.raises(KqError, match="client w is closed"):
            answer()
    assert client._io.records == []


def test_a_subscribe_left_unanswered_is_undone_and_a_refused_one_is_not():
    """A subscribe the service answered after the request timeout (a busy service, a shard
    changing owner) made a subscription the client had forgotten: leases went to it, and its
    deliveries were dropped, until the leases lapsed."""
    from broker import wire
    from broker.client import CommandError
    from broker.errors import KqError
    client, _ = client_holding_one_message()
    client._closed = threading.Event()
    for error, sent in ((KqError("no answer from the kq service"), ["unsubscribe"]),
                        (CommandError("unknown queue 'Q2'"), [])):
        def no_subscription(kind, error=error, **fields):
            raise error
        client._request = no_subscription
        client._io.records.clear()
        with pytest.raises(KqError):
            client.subscribe("Q2")
        commands = [wire.decode("command", out.value) for out in client._io.records]
        assert [c["type"] for c in commands] == sent
        assert all(c["sub_id"] not in client.core.subs for c in commands)
        assert list(client.core.subs) == ["s1"]


@pytest.mark.parametrize(("args", "why"), [
    (("Q", None, 2**31), "max_backlog must be <= 2147483647"),
    ((5, None, None), "queue and filter are text"),
    (("Q", 5, None), "queue and filter are text"),
])
def test_subscribe_arguments_kq_cannot_carry_are_refused_at_the_call(args, why):
    """They raised ValueError from the Avro encoder, or (a backlog past int32) stopped the
    service."""
    from broker.client import CommandError
    from broker.client.arguments import subscribe_command
    with pytest.raises(CommandError, match=why):
        subscribe_command(*args, mode="queue", replay_period=None)


def test_an_answer_that_raises_leaves_the_message_unanswered():
    """A closed client's ack or expire raised and the message was taken for answered all
    the same: a worker then sent nothing else for it."""
    from broker.errors import KqError
    client, msg = client_holding_one_message()
    client.core.closed = True
    for answer in (msg.ack, msg.expire):
        with pytest.raises(KqError):
            answer()
        assert not msg.answered


def test_waits_are_seconds_or_text_and_never_nothing():
    """`messages(timeout="5s")` raised TypeError; a heartbeat interval of 0 sent heartbeats
    without pause."""
    from broker.client import CommandError
    from broker.client.arguments import seconds, waits
    assert seconds("5s", "timeout") == 5.0 and seconds(0.25, "timeout") == 0.25
    assert seconds(None, "timeout") is None
    assert waits("10s", 0.5) == (10.0, 0.5)
    for bad in [(0, 1.0), (10.0, 0), (10.0, "-1s"), ("soon", 1.0), (float("nan"), 1.0)]:
        with pytest.raises(CommandError, match="request_timeout|heartbeat_interval"):
            waits(*bad)
    with pytest.raises(CommandError, match="heartbeat_interval"):
        QueueClient("127.0.0.1:1", heartbeat_interval=0)  # (said before Kafka is asked)


def test_messages_take_their_timeout_as_text():
    from broker.client.message import batch_of
    from broker.client.sync import Subscription
    client, _ = client_holding_one_message()
    client._closed = threading.Event()
    client._pump = lambda timeout: None
    sub = Subscription(client, "Q", "s2")  # (a sync one: the compiled core's state takes no
    client.core.add(sub)                   # attribute added later)
    client.core.subscribed(sub, {"backlog": 1})
    client.core._deliver("s2", "Q", "json", batch_of([("T/0/1", 1, None, False, 0, None,
                                                         b"{}", [], 0)]))
    assert [m.bookmark for m in sub.messages(timeout="10ms")] == ["T/0/1"]


def test_acks_kept_with_no_subscription_open_go_with_the_next_heartbeat():
    """They waited for the close (whose refusals are never read): a late ack after the
    subscription closed was never reported."""
    client, msg = client_holding_one_message()
    client.core.subs.clear()
    client.core.acks.subscribed("Q", 100)  # (a batch not yet due)
    msg.ack()
    assert client._io.records == []
    client._closed, client._beating, client._heartbeat_s = threading.Event(), threading.Lock(), 0.01
    client._io.read_if_idle = lambda core: client._closed.set()  # one beat, then stop
    client._again = None
    client._beat()
    assert len(client._io.records) == 1


def test_a_call_waiting_for_an_answer_ends_when_another_thread_closes_the_client():
    """It waited out its request_timeout, or (sync) read from the consumer the close had
    closed under it: librdkafka's RuntimeError "Consumer closed"."""
    import time

    from broker.errors import KqError
    client, msg = client_holding_one_message()
    client.name, client.request_timeout = "w", 30.0
    client._closed = threading.Event()
    client._io.producer = type("P", (), {"flush": lambda self, t: 0})()
    client._pump = lambda timeout: time.sleep(0.01)
    failed: list[Exception] = []

    def wait_for_an_answer():
        try:
            client.ack("Q", ["T/0/0"])
        except KqError as exc:
            failed.append(exc)

    waiting = threading.Thread(target=wait_for_an_answer)
    started = time.monotonic()
    waiting.start()
    client._closed.set()  # what close() does first
    waiting.join(5)
    assert time.monotonic() - started < 5 and "was closed while waiting" in str(failed[0])


def test_the_consumer_is_closed_only_between_reads(monkeypatch):
    from broker.client import transport
    from broker.client.transport import Transport
    io = Transport.__new__(Transport)
    io.read_lock, io.consumer_closed = threading.Lock(), False
    closed = threading.Event()
    io.consumer = type("C", (), {"close": lambda self: closed.set()})()

    def take(consumer, n, timeout):
        assert not closed.is_set(), "read from a closed consumer"
        return []

    monkeypatch.setattr(transport.clients, "take", take)
    io.close_consumer()
    assert closed.is_set() and io.read(ClientCore("w", "w"), 0.1) == 0
    io.read_if_idle(ClientCore("w", "w"))


def subscription_holding(client, bookmarks, backlog):
    from broker.client.message import batch_of
    from broker.client.sync import Subscription
    sub = Subscription(client, "Q2", "s2")  # (Q's backlog of 1 makes every ack due at once)
    client.core.add(sub)
    client.core.subscribed(sub, {"backlog": backlog})
    client.core._deliver("s2", "Q2", "json", batch_of(
        [(b, 1, None, False, 0, None, b"{}", [], 0) for b in bookmarks]))
    return sub


def test_acks_kept_wait_for_company_then_go_as_one_command_before_a_longer_wait(monkeypatch):
    """At a steady rate each delivery brought back a command of its own: the acks kept go
    once the oldest is ACK_LINGER_S old, not each time the subscriber waits."""
    import time

    from broker.client.acks import ACK_LINGER_S
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    client, _ = client_holding_one_message()
    client._closed = threading.Event()
    waits = []  # (how long the client waited, commands sent before it)

    def pump(timeout):
        waits.append((timeout, len(client._io.records)))
        now[0] += timeout

    client._pump = pump
    sub = subscription_holding(client, ["T/0/1", "T/0/2"], backlog=100)
    for msg in sub.messages(timeout=1):
        msg.ack()
    assert waits[0] == (pytest.approx(ACK_LINGER_S), 0)  # kept through the first wait
    assert waits[1][1] == 1  # then both went, in one command
    assert len(client._io.records) == 1


def test_acks_kept_go_when_messages_returns():
    client, _ = client_holding_one_message()
    client._closed = threading.Event()
    client._pump = lambda timeout: None
    sub = subscription_holding(client, ["T/0/1"], backlog=100)
    for msg in sub.messages(timeout=0):
        msg.ack()
    assert len(client._io.records) == 1
