"""Which rows a state write puts and deletes: exactly the queued messages and their payloads
stay in the store, and a message queued and finished between two writes costs none."""

from hypothesis import example, given
from hypothesis import strategies as st

from broker.engine import events as ev
from broker.engine.effects import Journal
from broker.state.layout import Checkpoint, message_key, payload_key
from broker.state.payload import Payload
from broker.state.store import MemoryStore
from broker.values import Bookmark
from tests.unit.harness import Harness, queue

POINTS = ["earliest", "2020-01-01T00:00:00Z"]  # a change of recovery point resets the queue


class Rows:
    """Two queues reading one topic (so sharing its payloads), the batches since the last
    state write gathered as the service's state window gathers them."""

    def __init__(self) -> None:
        self.h = Harness(queue("A"), queue("B"))
        self.store, self.cp = MemoryStore(), Checkpoint()
        self.resets = {"A": 0, "B": 0}
        for name in "AB":
            self.run(ev.Configured(name, POINTS[0], 0))
            self.run(ev.Subscribed("w", f"w-{name}", name, 1000, "r1"))

    def run(self, event: ev.Event) -> None:
        for e in self.h.handle(event):
            if isinstance(e, Journal):
                self.cp.add(e.transition, e.message)

    def arrive(self, name: str, offset: int) -> Bookmark:
        bm = Bookmark("T", 0, offset)
        self.cp.payloads[bm] = Payload(None, b"%d" % offset, [], self.h.now)
        self.run(ev.MessageArrived(name, bm, self.h.now))
        return bm

    def ack(self, name: str, every: int = 1) -> None:
        q = self.h.engine.queue(name)
        leased = sorted(b for b, m in q.messages.items() if m.holder == f"w-{name}")
        if leased:
            self.run(ev.Acked("w", name, tuple(leased[::every]), "ack"))

    def reset(self, name: str) -> None:
        self.resets[name] += 1
        self.run(ev.Configured(name, POINTS[self.resets[name] % 2], 0))

    def changes(self) -> tuple[set[bytes], set[bytes]]:
        out = self.cp.changes(self.h.engine)
        return set(out.puts), set(out.deletes)

    def write(self) -> None:
        self.cp.write(self.store, self.h.engine)
        self.cp = Checkpoint()

    def stored(self, prefix: bytes) -> set[bytes]:
        return {k for k, _ in self.store.scan(prefix)}

    def queued(self) -> tuple[set[bytes], set[bytes]]:
        queues = self.h.engine.queues
        return ({message_key(n, bm) for n, q in queues.items() for bm in q.messages},
                {payload_key(bm) for q in queues.values() for bm in q.messages})


def test_a_message_queued_and_acked_between_two_writes_costs_the_store_nothing():
    r = Rows()
    r.write()
    bm = r.arrive("A", 0)
    r.ack("A")
    puts, deletes = r.changes()
    assert not {message_key("A", bm), payload_key(bm)} & (puts | deletes)


def test_a_message_written_before_its_ack_is_deleted_with_its_payload():
    r = Rows()
    bm = r.arrive("A", 0)
    r.write()
    assert r.stored(b"m") == {message_key("A", bm)} and r.stored(b"p") == {payload_key(bm)}
    r.ack("A")
    _, deletes = r.changes()
    assert {message_key("A", bm), payload_key(bm)} <= deletes
    r.write()
    assert r.stored(b"m") == r.stored(b"p") == set()


def test_a_payload_another_queue_held_before_is_deleted_once_neither_holds_it():
    r = Rows()
    bm = r.arrive("A", 0)
    r.write()
    r.arrive("B", 0)  # B reads the same record later: its row and A's share the payload
    r.ack("B")
    r.ack("A")
    puts, deletes = r.changes()
    assert message_key("B", bm) not in puts | deletes  # B's row was never written
    assert {message_key("A", bm), payload_key(bm)} <= deletes


def test_a_message_removed_and_read_again_before_the_write_still_loses_its_old_row():
    r = Rows()
    bm = r.arrive("A", 0)
    r.write()
    r.reset("A")  # removed (the queue starts again), then the same record read again, acked
    r.arrive("A", 0)
    assert bm in r.h.engine.queue("A").messages
    r.ack("A")
    _, deletes = r.changes()
    assert {message_key("A", bm), payload_key(bm)} <= deletes
    r.write()
    assert r.stored(b"m") == r.stored(b"p") == set()


@given(st.lists(st.tuples(st.sampled_from(["read", "ack", "reset", "write"]),
                          st.sampled_from("AB"), st.integers(1, 4)), max_size=50))
# read by both, written, then one reset and read again, acked, in one window
@example([("read", "A", 2), ("read", "B", 2), ("write", "A", 1), ("reset", "A", 1),
          ("read", "A", 2), ("ack", "A", 1), ("ack", "B", 1), ("write", "A", 1)])
def test_the_store_holds_exactly_the_queued_messages_and_their_payloads(steps):
    r = Rows()
    read = {"A": 0, "B": 0}
    for op, name, n in steps:
        if op == "read":  # the queue's next n records
            for offset in range(read[name], read[name] + n):
                r.arrive(name, offset)
            read[name] += n
        elif op == "ack":  # every n-th lease
            r.ack(name, n)
        elif op == "reset":  # emptied; read again from offset 0 or from where it was
            r.reset(name)
            read[name] = 0 if r.resets[name] % 2 else read[name]
        else:
            r.write()
            assert (r.stored(b"m"), r.stored(b"p")) == r.queued()
    r.write()
    assert (r.stored(b"m"), r.stored(b"p")) == r.queued()
