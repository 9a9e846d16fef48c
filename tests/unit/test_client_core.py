"""The client's sans-I/O core, property-tested: whatever the order and repetition of what
the service sends, and however acks are interleaved, each delivery is handed out once, each
ack goes out once with the delivery it answers, and a reply in chunks is whole."""

import sys
import threading

from hypothesis import given
from hypothesis import strategies as st

from broker import wire
from broker.client.acks import ACK_BATCH
from broker.client.core import ClientCore, SubscriptionState
from broker.client.message import Message, batch_of
from broker.packed import unpack_array

deliveries = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3)), max_size=60)


def _core() -> tuple[ClientCore, SubscriptionState]:
    core = ClientCore("c", "c")
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    return core, sub


def _delivery(offset: int, count: int) -> tuple:
    # (bookmark, delivery_count, lease_deadline_ms, is_barrier, seq, key, value, headers, ts)
    return (f"T/0/{offset}", count, None, False, offset, None, b"{}", [], 0)


@given(deliveries)
def test_each_delivery_is_handed_out_once_in_arrival_order(sent):
    core, sub = _core()
    for offset, count in sent:
        core._deliver("s1", "Q", "json", batch_of([_delivery(offset, count)]))
    latest: dict[int, int] = {}  # a copy of a delivery, or of an older one, is not handed out
    expected = []
    for offset, count in sent:
        if count > latest.get(offset, 0):
            latest[offset] = count
            expected.append((offset, count))
    assert [(int(m.bookmark.rsplit("/", 1)[1]), m.delivery_count) for m in sub.buffer] == expected


def test_a_copy_dropped_inside_an_envelope_leaves_the_others_their_own_payloads():
    core, sub = _core()

    def delivery(offset: int) -> tuple:
        return (f"T/0/{offset}", 1, None, False, offset, b"k" * offset, b"v%d" % offset,
                [("h", b"%d" % offset)] * (offset % 2), offset)

    core._deliver("s1", "Q", "json", batch_of([delivery(1), delivery(2)]))
    core._deliver("s1", "Q", "json", batch_of([delivery(2), delivery(3), delivery(1),
                                               delivery(4)]))
    assert [(m.bookmark, m.key, m.value, m.headers) for m in sub.buffer] == [
        (f"T/0/{o}", b"k" * o, b"v%d" % o, [("h", b"%d" % o)] * (o % 2)) for o in (1, 2, 3, 4)]


def test_a_message_enqueued_again_is_handed_out_again():
    core, sub = _core()
    for seq in (1, 1, 7, 7):  # the same bookmark, enqueued again with a later arrival number
        core._deliver("s1", "Q", "json",
                      batch_of([("T/0/1", 1, None, False, seq, None, b"{}", [], 0)]))
    assert [m.delivery_count for m in sub.buffer] == [1, 1]


def test_acks_go_together_once_half_the_backlog_is_acked():
    core, sub = _core()
    core.subscribed(sub, {"backlog": 10})
    due = [core.ack(Message("Q", f"T/0/{i}", None, None, [], 1, None, False, 0, None))
           for i in range(10)]
    assert due == [False] * 4 + [True] * 6
    assert len(core.take_acks()) == 1


def test_acks_kept_past_a_full_command_go_in_several():
    core, sub = _core()
    core.subscribed(sub, {"backlog": 4 * ACK_BATCH})  # due at 2 * ACK_BATCH: more than fit
    for i in range(2 * ACK_BATCH + 7):
        core.ack(Message("Q", f"T/0/{i}", None, None, [], 1, None, False, 0, None))
    sent = [wire.decode("command", o.value) for o in core.take_acks()]
    assert [len(acked(c)) for c in sent] == [ACK_BATCH, ACK_BATCH, 7]
    assert [b for c in sent for b, _ in acked(c)] == [f"T/0/{i}" for i in range(2 * ACK_BATCH + 7)]


def test_a_sync_message_acks_through_its_core_and_calls_the_client_when_a_batch_is_due():
    class Client:  # what QueueClient offers a Message
        def __init__(self) -> None:
            self.sends, self.waited = 0, []

        def _send_acks(self) -> None:
            self.sends += 1
            core.take_acks()

        def _ack(self, msg: Message, wait: bool) -> None:
            self.waited.append((msg.bookmark, wait))

    client = Client()
    core = ClientCore("c", "c", owner=client)
    sub = SubscriptionState("Q", "s1", "queue", {})
    core.add(sub)
    core.subscribed(sub, {"backlog": 10})
    core._deliver("s1", "Q", "json", batch_of([_delivery(i, 1) for i in range(11)]))
    msgs = list(sub.buffer)
    for msg in msgs[:10]:
        msg.ack()
    assert client.sends == 2 and client.waited == []  # half the backlog (5) per batch
    msgs[10].ack(wait=True)  # a confirmed ack goes to the client itself
    assert client.waited == [("T/0/10", True)] and all(m.answered for m in msgs)


def test_an_envelope_whose_columns_disagree_or_payloads_are_cut_is_ignored(caplog):
    core, sub = _core()
    bad = batch_of([_delivery(1, 1), _delivery(2, 1)])
    bad["seqs"] = bad["seqs"][:8]  # one seq for two messages
    cut = batch_of([_delivery(4, 1)])
    cut["payloads"] = cut["payloads"][:10]  # a payload cut short
    for batch in (bad, cut, batch_of([_delivery(3, 1)])):
        core.receive(wire.encode("envelope", {
            "kind": "messages", "request_id": "", "sub_id": "s1", "queue": "Q",
            "bookmark": "", "delivery_count": 0, "lease_deadline_ms": None,
            "is_barrier": False, "format": "json", "key": None, "value": None, "headers": [],
            "timestamp_ms": 0, "body": None, "error": None, "seq": 0,
            "batch": ("kq.DeliveryBatch", batch)}))
    assert [m.bookmark for m in sub.buffer] == ["T/0/3"]
    assert "columns differ in length" in caplog.text
    assert caplog.text.count("ignored an unreadable record") == 2


@given(st.lists(st.tuples(st.sampled_from(["Q", "R"]), st.integers(0, 10_000),
                          st.integers(1, 5)), max_size=700),
       st.lists(st.integers(0, 700), max_size=5))
def test_every_ack_goes_out_once_with_its_delivery_count(acks, takes_at):
    core, _ = _core()
    sent: list[dict] = []
    for i, (queue, offset, count) in enumerate(acks):
        msg = Message(queue, f"T/0/{offset}", None, None, [], count, None, False, 0, None)
        if core.ack(msg) or i in takes_at:
            sent += [wire.decode("command", o.value) for o in core.take_acks()]
    sent += [wire.decode("command", o.value) for o in core.take_acks()]
    assert all(c["type"] == "ack" and len(acked(c)) <= ACK_BATCH for c in sent)
    out = [(c["queue"], b, n) for c in sent for b, n in acked(c)]
    assert sorted(out) == sorted((q, f"T/0/{o}", n) for q, o, n in acks)
    for queue in ("Q", "R"):  # each queue's acks keep their order
        assert [x for x in out if x[0] == queue] == [
            (q, f"T/0/{o}", n) for q, o, n in acks if q == queue]


def test_acks_from_many_threads_while_another_takes_go_out_once_each():
    """Keeping an ack takes no lock (one atomic list append): none is lost or sent twice
    while handler threads ack and a reader takes the batches due."""
    core, sub = _core()
    core.subscribed(sub, {"backlog": 40})
    sent: list[dict] = []
    done = threading.Event()

    def take() -> None:
        while not done.is_set():
            sent.extend(wire.decode("command", o.value) for o in core.take_acks())

    def handle(worker: int) -> None:
        for i in range(3000):
            core.ack(Message("Q", f"T/{worker}/{i}", None, None, [], 1 + i % 3, None, False, 0,
                             None))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between almost any two steps
    try:
        reader = threading.Thread(target=take)
        reader.start()
        handlers = [threading.Thread(target=handle, args=(w,)) for w in range(4)]
        for t in handlers:
            t.start()
        for t in handlers:
            t.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    sent.extend(wire.decode("command", o.value) for o in core.take_acks())
    out = [(b, n) for c in sent for b, n in acked(c)]
    assert sorted(out) == sorted((f"T/{w}/{i}", 1 + i % 3) for w in range(4) for i in range(3000))
    for w in range(4):  # each thread's acks in the order it made them
        assert [b for b, _ in out if b.startswith(f"T/{w}/")] == [f"T/{w}/{i}" for i in range(3000)]


@given(st.permutations(range(4)), st.lists(st.integers(), min_size=1, max_size=20))
def test_a_reply_in_chunks_is_whole_in_any_order(order, rows):
    core, _ = _core()
    rid, _ = core.request("query", query="{}")
    parts = [rows[i::4] for i in range(4)]
    for i in order:
        assert core.answer(rid) is None
        core._reply(rid, None, {"chunk": i, "chunks": 4, "rows": parts[i], "what": "q"})
    error, body = core.answer(rid)
    assert error is None and body["what"] == "q"
    assert body["rows"] == [r for part in parts for r in part]


def test_a_command_after_acks_carries_them_first():
    core, _ = _core()
    core.ack(Message("Q", "T/0/1", None, None, [], 2, None, False, 0, None))
    out = [wire.decode("command", o.value) for o in core.command("close", shard=0)]
    assert [(c["type"], acked(c)) for c in out] == [("ack", [("T/0/1", 2)]), ("close", [])]


def acked(command: dict) -> list[tuple[str, int]]:
    """The (bookmark, delivery count) pairs a command answers: batched acks come packed."""
    if command["packed_bookmarks"]:
        assert not command["bookmarks"]
        return list(zip(command["packed_bookmarks"].split("\n"),
                        unpack_array("i", command["packed_counts"]), strict=True))
    return list(zip(command["bookmarks"], command["delivery_counts"], strict=True))


def test_a_delivery_becomes_a_message_with_every_field_it_carried():
    core = ClientCore("c", "c", owner="the client")
    browser = SubscriptionState("Q", "b1", "browse", {})
    core.add(browser)
    headers = [("h", b"1")]
    core._deliver("b1", "Q", "json", batch_of([
        ("T/0/7", 3, 1_500, True, 7, b"k", b'{"a": 1}', headers, 2_500)]))
    msg = browser.buffer.popleft()
    assert (msg.queue, msg.bookmark, msg.key, msg.value, msg.headers) == (
        "Q", "T/0/7", b"k", b'{"a": 1}', headers)
    assert (msg.delivery_count, msg.lease_deadline, msg.is_barrier, msg.timestamp) == (
        3, 1.5, True, 2.5)
    assert msg.browsed and not msg.answered and msg._client == "the client"
    assert msg.data == {"a": 1}  # read with the queue's format
    core._deliver("b1", "Q", "json", batch_of([("T/0/8", 1, None, False, 8, None, b"x", [], 0)]))
    assert browser.buffer.popleft().lease_deadline is None  # at-most-once: no lease


def test_each_process_sends_its_own_instance_and_hears_of_another_using_its_name():
    told: list[str] = []
    one, other = ClientCore("w", "w", on_refused=told.append), ClientCore("w", "w")
    instances = {wire.decode("command", o.value)["instance"]
                 for core in (one, other) for o in core.command("heartbeat", shard=0)}
    assert len(instances) == 2 and "" not in instances
    again = {wire.decode("command", o.value)["instance"] for o in one.command("heartbeat", shard=0)}
    assert again <= instances  # one process: one instance for all its commands
    one.receive(wire.encode("envelope", {
        "kind": "reply", "request_id": "", "body": '{"notice": "name-in-use", "shard": 0}',
        "error": None}))
    assert one.errors == told and len(told) == 1
    assert "another live process uses the client name 'w'" in told[0]
