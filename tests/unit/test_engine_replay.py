"""Recovery replays journaled transitions through `apply`: it must rebuild the same state."""

from broker.engine import events as ev
from broker.engine.engine import Engine
from broker.values import Bookmark, Duration
from tests.unit.harness import Harness, delivered, queue


def snapshot(engine: Engine) -> dict:
    return {
        name: (
            sorted((str(m.bookmark), m.state.value, m.delivery_count, m.cancel_count, m.holder,
                    m.deadline_ms) for m in q.messages.values()),
            sorted((s.sub_id, s.cap, sorted(map(str, s.held))) for s in q.subs.values()),
            (q.stats.acked, dict(q.stats.removed), q.stats.next_seq),
        )
        for name, q in engine.queues.items()
    }


def test_replaying_the_journal_into_a_fresh_engine_gives_the_same_state():
    cfg = (queue(lease_period=Duration(1000), max_cancels=1, dead_letter_topic="D"),
           queue("M", semantics="at-most-once"))
    h = Harness(*cfg)
    bms = h.publish(6)
    h.publish(3, queue="M")
    h.subscribe("w1", backlog=2)
    h.subscribe("w2", backlog=3)
    h.subscribe("w3", "M")
    for c, bm, _ in delivered(h.effects)[:2]:
        h.ack(c, bm) if c != "w3" else None
    h.cancel("w2", bms[3])
    h.advance(1500)
    h.handle(ev.Unsubscribed("w1", "w1-Q"))
    fresh = Engine(cfg, 10_000)
    for t in h.journal:
        fresh.apply(t)
    assert snapshot(fresh) == snapshot(h.engine)


def test_the_engine_imports_no_io_library():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2] / "broker" / "engine"
    forbidden = re.compile(r"^\s*(import|from)\s+(confluent_kafka|rocksdict|fastavro|typer|"
                           r"pyspark|broker\.kafka|broker\.state|broker\.service|cli)\b", re.M)
    offenders = [p.name for p in root.glob("*.py") if forbidden.search(p.read_text())]
    assert offenders == []


def test_restored_subscriptions_get_nothing_until_their_client_is_heard_from():
    from broker.engine.queue import Message

    h = Harness()
    (a,) = h.publish(1)
    fresh = Engine((queue(),), 10_000)
    sub = h.subscribe("w1")
    restored_sub = next(t for t in h.journal if t.kind.value == "subscribed")
    fresh.restore("Q", [Message(a, 0, h.now)], [restored_sub], h.now)
    assert delivered(fresh.handle(ev.Tick(), h.now)) == []
    assert delivered(fresh.handle(ev.Heartbeat("w1"), h.now)) == [("w1", a, 1)]
    assert sub  # the original engine delivered at once
    # and a client never heard from again loses the subscription after the timeout
    gone = Engine((queue(),), 10_000)
    gone.restore("Q", [Message(a, 0, h.now)], [restored_sub], h.now)
    gone.handle(ev.Tick(), h.now + 10_000)
    assert gone.subs == {}


def test_a_new_queue_is_configured_once_and_skips_records_older_than_its_start():
    h = Harness(queue(recovery_point="latest"))
    out = h.handle(ev.Configured("Q", "latest", h.now))
    assert [e.transition.kind.value for e in out if hasattr(e, "transition")] == ["configured"]
    assert h.handle(ev.Configured("Q", "latest", h.now + 5)) == []  # unchanged: nothing
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now - 1))  # older than the start
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 1), h.now))
    assert [str(b) for b in h.engine.queue("Q").messages] == ["T/0/1"]


def test_changing_the_recovery_point_removes_everything_and_marks_a_reset():
    h = Harness(queue(semantics="at-most-once"))
    h.handle(ev.Configured("Q", "earliest", 0))
    a, b = h.publish(2)
    h.subscribe("w1")  # a is sent (at-most-once), b available
    out = h.handle(ev.Configured("Q", "2026-01-01T00:00:00Z", 1_767_225_600_000))
    kinds = [(e.transition.kind.value, e.transition.reason) for e in out
             if hasattr(e, "transition")]
    assert kinds == [("released", "reset"), ("removed", "reset"),
                     ("configured", "2026-01-01T00:00:00Z")]
    assert h.engine.resets(out) == {"Q"}
    q = h.engine.queue("Q")
    assert q.messages == {} and q.start_ms == 1_767_225_600_000


def test_a_queue_read_again_from_an_earlier_offset_after_its_recovery_point_moved_on():
    # Once the recovery point had passed every message left after a reset, the next arrival
    # (an earlier offset: the queue starts again from the beginning) crashed the service.
    from broker.service.queries import recovery_points

    h = Harness(queue(semantics="at-most-once"))
    h.handle(ev.Configured("Q", "earliest", 0))
    h.offset = 5
    h.publish(2)
    h.handle(ev.Configured("Q", "2026-01-01T00:00:00Z", 0))
    q = h.engine.queue("Q")
    assert recovery_points(q, {}) == {}  # the removed ones passed
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 0), h.now))
    h.handle(ev.MessageArrived("Q", Bookmark("T", 0, 1), h.now))
    assert [str(b) for b in q.messages] == ["T/0/0", "T/0/1"]
    assert recovery_points(q, {}) == {("T", 0): 0}


def test_the_service_and_the_cli_start_without_spark():
    """`kq serve` and every command but report, audit and replay --engine spark must not pay
    for Spark (nor need it installed)."""
    import subprocess
    import sys

    code = ("import sys, broker.service.service, cli.main; "
            "sys.exit(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyspark', 'pyarrow', 'pandas', 'matplotlib')) or 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
