"""Hypothesis: random event sequences never break the queue invariants."""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.engine import events as ev
from broker.engine.effects import Deliver, Journal
from broker.engine.engine import Engine
from broker.engine.transitions import Kind
from broker.values import Bookmark, Duration
from tests.unit.harness import queue

CLIENTS = ["a", "b", "c"]
QUEUES = {
    "ALO": queue("ALO", lease_period=Duration(3000), max_deliveries=4, max_cancels=2,
                 max_per_subscription_backlog=3, expiration=Duration(40_000)),
    "AMO": queue("AMO", semantics="at-most-once", lease_period=Duration(3000)),
    "FAST": queue("FAST", fairness="fast", leasing="permissive"),
}


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(QUEUES.values(), heartbeat_timeout_ms=8000)
        self.now = 10_000
        self.offset = 0
        self.holder: dict[tuple[str, Bookmark], str] = {}  # from the journal
        self.enqueued: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.amo_sent: set[Bookmark] = set()
        self.delivered: list[tuple[str, str, Bookmark]] = []

    def _run(self, event: ev.Event) -> None:
        for e in self.engine.handle(event, self.now):
            if isinstance(e, Deliver):
                key = (e.queue, e.bookmark)
                assert self.holder.get(key) == e.sub_id, "delivered without a journaled lease"
                self.delivered.append((e.client, e.queue, e.bookmark))
                if e.queue == "AMO":
                    assert e.bookmark not in self.amo_sent, "at-most-once delivered twice"
                    self.amo_sent.add(e.bookmark)
            elif isinstance(e, Journal):
                t = e.transition
                key = (t.queue, t.bookmark)
                if t.kind in (Kind.LEASED, Kind.SENT):
                    assert key not in self.holder, "leased twice at once"
                    self.holder[key] = t.sub_id
                elif t.kind in (Kind.ACKED, Kind.RETURNED, Kind.REMOVED, Kind.RELEASED):
                    self.holder.pop(key, None)
                if t.kind is Kind.ENQUEUED:
                    self.enqueued[t.queue] += 1
                elif t.kind in (Kind.ACKED, Kind.REMOVED, Kind.RELEASED):
                    self.finished[t.queue] += 1

    @rule(q=st.sampled_from(sorted(QUEUES)), n=st.integers(1, 4))
    def publish(self, q: str, n: int) -> None:
        for _ in range(n):
            self._run(ev.MessageArrived(q, Bookmark("T", 0, self.offset), self.now))
            self.offset += 1

    @rule(c=st.sampled_from(CLIENTS), q=st.sampled_from(sorted(QUEUES)), b=st.integers(0, 5))
    def subscribe(self, c: str, q: str, b: int) -> None:
        self._run(ev.Subscribed(c, f"{c}-{q}", q, b, "r"))

    @rule(c=st.sampled_from(CLIENTS), q=st.sampled_from(sorted(QUEUES)))
    def unsubscribe(self, c: str, q: str) -> None:
        self._run(ev.Unsubscribed(c, f"{c}-{q}"))

    @rule(i=st.integers(0, 50), how=st.sampled_from(["ack", "cancel", "expire", "wrong-ack"]))
    def act_on_a_delivery(self, i: int, how: str) -> None:
        if not self.delivered:
            return
        c, q, bm = self.delivered[i % len(self.delivered)]
        if how == "wrong-ack":
            c = CLIENTS[(CLIENTS.index(c) + 1) % len(CLIENTS)]
        event = {"ack": ev.Acked(c, q, (bm,)), "wrong-ack": ev.Acked(c, q, (bm,)),
                 "cancel": ev.Cancelled(c, q, bm), "expire": ev.ExpireRequested(c, q, bm)}[how]
        self._run(event)

    @rule(ms=st.integers(0, 6000), beat=st.sets(st.sampled_from(CLIENTS)))
    def time_passes(self, ms: int, beat: set[str]) -> None:
        self.now += ms
        for c in sorted(beat):
            self._run(ev.Heartbeat(c))
        self._run(ev.Tick())

    @invariant()
    def backlog_never_exceeded(self) -> None:
        for q in self.engine.queues.values():
            for s in q.subs.values():
                assert len(s.held) <= s.cap
                held = {bm for (qn, bm), sid in self.holder.items() if sid == s.sub_id}
                assert held == s.held

    @invariant()
    def every_message_is_finished_or_still_queued(self) -> None:
        for name, q in self.engine.queues.items():
            assert self.enqueued[name] == self.finished[name] + len(q.messages)
            assert q.stats.enqueued == q.stats.acked + sum(q.stats.removed.values()) \
                + len(q.messages)

    @invariant()
    def oldest_available_first(self) -> None:
        for q in self.engine.queues.values():
            if q.available and any(s.room > 0 for s in q.subs.values()):
                raise AssertionError("available messages and room, yet nothing dispatched")


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
