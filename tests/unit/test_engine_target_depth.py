"""TargetQueueDepth: only N active; records beyond wait in Kafka; early acks are remembered."""

from broker.engine import events as ev
from broker.engine.effects import Defer, Resume
from broker.engine.engine import Engine
from broker.state.layout import Checkpoint, load_engine
from broker.state.store import MemoryStore
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue, rejected, replies


def arrive(h: Harness, offset: int):
    bm = Bookmark("Q", 0, offset)
    return bm, h.handle(ev.MessageArrived("Q", bm, h.now))


def test_only_n_messages_are_active_and_the_rest_are_deferred():
    h = Harness(queue(target_queue_depth=2))
    outs = [arrive(h, i)[1] for i in range(4)]
    assert [any(isinstance(e, Defer) for e in out) for out in outs] == [False, False, True, True]
    assert h.engine.queue("Q").depth() == 2


def test_room_again_resumes_and_the_deferred_record_is_taken_when_read_again():
    h = Harness(queue(target_queue_depth=1))
    a, _ = arrive(h, 0)
    b, out = arrive(h, 1)
    assert any(isinstance(e, Defer) for e in out)
    h.subscribe("w1")
    out = h.ack("w1", a)
    assert [e for e in out if isinstance(e, Resume)] == [Resume("Q")]
    _, out = arrive(h, 1)  # the shell reads it again from Kafka
    assert delivered(out) == [("w1", b, 1)]


def test_an_ack_for_a_message_not_active_yet_is_remembered_and_honoured():
    h = Harness(queue(target_queue_depth=1))
    arrive(h, 0)
    early = Bookmark("Q", 0, 5)
    out = h.ack("w1", early)
    assert rejected(out) == [] and replies(out)[-1].body == {"acked": 1}
    assert early in h.engine.queue("Q").pending_acks
    h.subscribe("w1")
    h.ack("w1", Bookmark("Q", 0, 0))
    arrive(h, 5)  # arrives: acked at once, never delivered
    q = h.engine.queue("Q")
    assert early not in q.messages and early not in q.pending_acks and q.stats.acked == 2
    assert ("w1", early, 1) not in delivered(h.effects)
    # an ack of something already read (and gone) is still refused
    assert "already acked" in rejected(h.ack("w1", Bookmark("Q", 0, 0)))[0]


def test_remembered_acks_and_read_positions_survive_a_restart():
    cfg = queue(target_queue_depth=1)
    h = Harness(cfg)
    arrive(h, 0)
    h.ack("w1", Bookmark("Q", 0, 7))
    store = MemoryStore()
    Checkpoint(transitions=list(h.journal)).write(store, h.engine)
    fresh = Engine((cfg,), 10_000)
    load_engine(store, fresh, h.now)
    q = fresh.queue("Q")
    assert q.pending_acks == {Bookmark("Q", 0, 7)} and q.read_upto == {("Q", 0): 1}
    replayed = Engine((cfg,), 10_000)
    for t in h.journal:
        replayed.apply(t)
    assert replayed.queue("Q").pending_acks == {Bookmark("Q", 0, 7)}
