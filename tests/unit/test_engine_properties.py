"""Hypothesis: random event sequences never break the queue invariants."""

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.engine import events as ev
from broker.engine.admission import lvq_value
from broker.engine.effects import Deliver, Flow, Journal
from broker.engine.engine import Engine
from broker.engine.paging import MemoryPager
from broker.engine.transitions import Kind, Transition
from broker.expr import Doc
from broker.service.coalesce import StateWindow
from broker.service.queries import recovery_points
from broker.state.layout import Checkpoint, load_engine
from broker.state.store import MemoryStore
from broker.values import Bookmark, Duration
from tests.unit.harness import queue

CLIENTS = ["a", "b", "c"]


# What expressions see of each message, by bookmark: the engine reads them through its doc
# loader (as the service reads payloads from its store), so they outlive a restart.
DOCS: dict[Bookmark, Doc] = {}
HEADERS: dict[Bookmark, dict] = {}  # of every message, parsed or not


def doc(m) -> Doc | None:
    return m.doc if m.doc is not None else DOCS.get(m.bookmark)


def rank(queue: str, m) -> tuple:
    """The delivery order SPEC 6 asks for, computed here independently of the engine: oldest
    first; in PRIO and PRIO2, numeric priority (from the payload) highest first, others
    last."""
    if queue == "LEV":  # priority_levels = 3 on the kq-priority header (Qpid: 0-3, 4, 5-9)
        raw = (doc(m).headers if doc(m) is not None else HEADERS.get(m.bookmark, {})).get(
            "kq-priority")
        p = int(raw) if raw is not None and len(raw) == 1 and raw.isdigit() else 4
        return (0, -{4: 1}.get(p, 0 if p < 4 else 2), m.seq)
    if queue == "SORT":  # sort_key = "/p", missing_sort_key = "last": numbers, strings, NULL
        p = doc(m).data.get("p") if doc(m) is not None else None
        if isinstance(p, int) and not isinstance(p, bool):
            return (0, p, m.seq)
        return (1, p, m.seq) if isinstance(p, str) else (2, 0, m.seq)
    if not queue.startswith("PRIO"):
        return (0, 0, m.seq)
    p = doc(m).data.get("p") if doc(m) is not None else None
    if not isinstance(p, int) or isinstance(p, bool):
        return (1, 0, m.seq)
    return (0, -p, m.seq)
QUEUES = {
    "ALO": queue("ALO", lease_period=Duration(3000), max_deliveries=4, max_cancels=2,
                 max_per_subscription_backlog=3, expiration=Duration(40_000)),
    "AMO": queue("AMO", semantics="at-most-once", lease_period=Duration(3000)),
    "FAST": queue("FAST", fairness="fast", leasing="permissive"),
    "PRIO": queue("PRIO", priority="/p", lease_period=Duration(3000),
                  barrier_expression="/kind = 'b'"),
    "BAR": queue("BAR", lease_period=Duration(3000), barrier_expression="/kind = 'b'",
                 max_per_subscription_backlog=3),
    "PRIO2": queue("PRIO2", priority="/p", lease_period=Duration(3000), leasing="permissive"),
    "LEV": queue("LEV", priority_levels=3, lease_period=Duration(3000)),
    # kq-not-before honoured; returns wait 1 s, 2 s, 4 s, ... at most 5 s
    "HOLD": queue("HOLD", hold_on_publish=True, lease_period=Duration(3000),
                  redelivery_delay=Duration(1000), redelivery_backoff="exponential",
                  max_redelivery_delay=Duration(5000)),
    "SORT": queue("SORT", sort_key="/p", missing_sort_key="last", lease_period=Duration(3000)),
    "LVQ": queue("LVQ", lvq_key="/p", lease_period=Duration(3000)),  # NULL /p: no key
    "RING": queue("RING", max_messages=4, overflow_policy="ring", lease_period=Duration(3000)),
    "REJ": queue("REJ", max_messages=3, overflow_policy="reject", lease_period=Duration(3000)),
    "FLOW": queue("FLOW", max_messages=3, overflow_policy="flow-control",
                  lease_period=Duration(3000)),
    # message groups by /p: sticky (NULL: no group), and shared (NULL: kq.no-group)
    "GRP": queue("GRP", group_key="/p", lease_period=Duration(3000),
                 max_per_subscription_backlog=3),
    "GRPS": queue("GRPS", group_key="/p", group_mode="shared", lease_period=Duration(3000),
                  fairness="round-robin"),
}
GROUPED = {"GRP": "sticky", "GRPS": "shared"}


def group(queue: str, bm: Bookmark) -> str | None:
    """A message's group, computed here from what was published."""
    p = DOCS[bm].data.get("p") if bm in DOCS else None
    if p is None:
        return "kq.no-group" if GROUPED[queue] == "shared" else None
    return str(p)
HOLDS = [None, None, 0, 500, 1500, 7000]  # kq-not-before: none, or this long after arrival
QUEUE_INDEX = st.integers(0, 63)  # a queue of the machine's `names`: index modulo their count
FILTERS = [None, "/p > 2", "/kind = 'a'", "/p IS NULL", "/p < 3 AND NOW() >= 0"]  # NOW(): walked
KINDS = ["a", "a", "a", "c", "b"]  # b: a barrier in PRIO and BAR


class QueueMachine(RuleBasedStateMachine):
    window: int | None = None  # the engine's default: nothing is paged out at these depths
    names = sorted(QUEUES)  # the queues its events go to (every queue is there)

    def __init__(self) -> None:
        super().__init__()
        DOCS.clear()
        HEADERS.clear()
        self.engine = self._engine()
        self.store = MemoryStore()  # what the service would have written after each batch
        self.now = 10_000
        self.offset = 0
        self.holder: dict[tuple[str, Bookmark], str] = {}  # from the journal
        self.enqueued: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        self.amo_sent: set[Bookmark] = set()
        self.delivered: list[tuple[str, str, Bookmark]] = []
        self.browsed: set[tuple[str, Bookmark]] = set()
        # HOLD: when each message is due, as computed here from what was published and done
        self.due: dict[Bookmark, int] = {}
        self.ever_held: set[Bookmark] = set()  # browsers skip a message while it is held
        # last-value queues: browsers skip an older value once a newer one with its key came
        self.ever_replaced: set[Bookmark] = set()
        self.delays: dict[Bookmark, int] = {}  # an explicit cancel delay, asked for
        self.flow: str | None = None  # the last FLOW record
        # GRP, GRPS: who holds each group, and (shared) how many of its messages, from the
        # journal by SPEC 6's rules
        self.group_holder: dict[tuple[str, str], str] = {}
        self.group_leased: Counter[tuple[str, str]] = Counter()
        self.restarted = False

    def _engine(self) -> Engine:
        engine = Engine(QUEUES.values(), heartbeat_timeout_ms=8000, window=self.window,
                        pager=MemoryPager())
        engine.doc_loader = lambda queue, bm: DOCS.get(bm)
        return engine

    def _run(self, event: ev.Event) -> None:
        effects = self.engine.handle(event, self.now)
        cp = Checkpoint()
        for e in effects:
            if isinstance(e, Journal):
                cp.add(e.transition, e.message)
        self._store_batch(cp)
        for e in effects:
            if isinstance(e, Flow):
                # (a start says where the queue stands, whatever was said before)
                assert e.state != self.flow or self.restarted, "the same flow record twice"
                self.flow, self.restarted = e.state, False
            if isinstance(e, Deliver) and e.sub_id.endswith("-browse"):
                assert e.lease_deadline_ms is None
                assert (e.sub_id, e.bookmark) not in self.browsed, "a browser shown it twice"
                self.browsed.add((e.sub_id, e.bookmark))
            elif isinstance(e, Deliver) and not e.is_barrier:
                key = (e.queue, e.bookmark)
                assert self.due.get(e.bookmark, 0) <= self.now, "delivered while held"
                assert self.holder.get(key) == e.sub_id, "delivered without a journaled lease"
                self.delivered.append((e.client, e.queue, e.bookmark))
                if e.queue == "AMO":
                    assert e.bookmark not in self.amo_sent, "at-most-once delivered twice"
                    self.amo_sent.add(e.bookmark)
            elif isinstance(e, Journal):
                t = e.transition
                key = (t.queue, t.bookmark)
                if t.kind is Kind.SUBSCRIBED and t.browse:  # a new browser: it sees all again
                    self.browsed = {(sid, bm) for sid, bm in self.browsed if sid != t.sub_id}
                if t.queue in GROUPED:
                    self._follow_groups(t, key)
                if t.kind in (Kind.LEASED, Kind.SENT):
                    assert key not in self.holder, "leased twice at once"
                    self.holder[key] = t.sub_id
                elif t.kind in (Kind.ACKED, Kind.RETURNED, Kind.REMOVED, Kind.RELEASED):
                    self.holder.pop(key, None)
                self._expect_hold(t)
                if t.kind is Kind.ENQUEUED:
                    self.enqueued[t.queue] += 1
                elif t.kind in (Kind.ACKED, Kind.REMOVED, Kind.RELEASED):
                    self.finished[t.queue] += 1
        self._check_order(effects)  # (with the group holders after the event, as the engine)

    def _follow_groups(self, t, key) -> None:
        """Sticky: the first subscription to lease a message of a group holds it until it
        ends. Shared: the one holding unacknowledged messages of it, while it does."""
        if t.kind is Kind.UNSUBSCRIBED:
            self.group_holder = {k: s for k, s in self.group_holder.items() if s != t.sub_id}
            return
        g = group(t.queue, t.bookmark) if t.bookmark is not None else None
        if g is None:
            return
        if t.kind in (Kind.LEASED, Kind.SENT):
            holder = self.group_holder.setdefault((t.queue, g), t.sub_id)
            assert holder == t.sub_id, f"group {g} leased to {t.sub_id} while {holder} holds it"
            self.group_leased[(t.queue, g)] += 1
        elif key in self.holder and t.kind in (Kind.ACKED, Kind.RETURNED, Kind.REMOVED,
                                               Kind.RELEASED):
            self.group_leased[(t.queue, g)] -= 1
            if GROUPED[t.queue] == "shared" and not self.group_leased[(t.queue, g)]:
                del self.group_holder[(t.queue, g)]

    def _may_take(self, queue: str, sub_id: str, m) -> bool:
        """In a group queue: `m` is first among the available ones of its group (a held one
        joins its group when released), and its group is free or `sub_id`'s."""
        if queue not in GROUPED:
            return True
        g = group(queue, m.bookmark)
        if g is None:
            return True
        if self.group_holder.get((queue, g), sub_id) != sub_id:
            return False
        return not any(o.state.value == "available" and o.not_before_ms is None
                       and group(queue, o.bookmark) == g and rank(queue, o) < rank(queue, m)
                       for o in self.engine.queues[queue].by_seq())

    def _expect_hold(self, t) -> None:
        """The moment a transition holds a message until is the one SPEC 4 and 6 give."""
        if t.kind is Kind.RETURNED:
            msg = self.engine.queues[t.queue].find(t.bookmark)
            asked = self.delays.pop(t.bookmark, None)
            if asked is None and t.queue == "HOLD" and t.reason in ("cancelled", "lapsed"):
                asked = min(1000 * 2 ** (msg.delivery_count - 1), 5000)
            expected = self.now + asked if asked else None
        elif t.kind is Kind.ENQUEUED and t.queue == "HOLD":
            raw = HEADERS[t.bookmark].get("kq-not-before")
            expected = int(raw) if raw is not None and int(raw) > self.now else None
        else:
            return
        assert t.not_before_ms == expected, f"{t} held until {t.not_before_ms}, not {expected}"
        if expected is not None:
            self.due[t.bookmark] = expected
            self.ever_held.add(t.bookmark)

    def _check_order(self, effects: list) -> None:
        """Each delivered message was the best available one its subscription wants: nothing
        still available after the event ranks higher (priority, then age) and matches, and
        what one subscription got in one event came best first."""
        last_rank: dict[str, tuple] = {}
        for e in effects:
            if isinstance(e, Deliver) and not e.is_barrier and not e.sub_id.endswith(
                    "-browse") and e.bookmark in self.engine.queues[e.queue].messages:
                r = rank(e.queue, self.engine.queues[e.queue].messages[e.bookmark])
                assert r > last_rank.get(e.sub_id, (-1e18,)), "given out of order in one go"
                last_rank[e.sub_id] = r
        for e in effects:
            if not isinstance(e, Deliver) or e.sub_id.endswith("-browse"):
                continue  # browsers are shown copies in arrival order, whatever the priority
            q = self.engine.queues[e.queue]
            sub = q.subs.get(e.sub_id)
            first = q.first_barrier()
            if e.is_barrier:  # sent once everything before it was finished, then gone
                assert e.bookmark not in q.messages
                assert not any(m.seq < (first.seq if first else 1e18) and m.bookmark.offset
                               < e.bookmark.offset and m.state.value != "sent"
                               for m in q.by_seq()), "barrier overtook a message"
                continue
            msg = q.messages.get(e.bookmark)
            if sub is None or msg is None:
                continue
            if first is not None:
                assert msg.seq < first.seq, f"{msg} delivered while barrier {first} waits"
            if e.queue in GROUPED:
                assert self._may_take(e.queue, e.sub_id, msg), f"{msg}: not its group's turn"
            for other in (m for m in q.by_seq() if m.state.value == "available"
                          and m.not_before_ms is None):
                if other.is_barrier or (first is not None and other.seq > first.seq):
                    continue  # a barrier, or held behind one
                if e.queue in GROUPED and not self._may_take(e.queue, e.sub_id, other):
                    continue  # another's group, or behind one of its group
                if rank(e.queue, other) < rank(e.queue, msg):
                    assert not sub.wants(doc(other)), f"{other} should have gone before {msg}"
            if sub.filter is not None:
                assert sub.wants(doc(msg)), "delivered against the subscription's filter"

    @rule(qi=QUEUE_INDEX,
          ps=st.lists(st.one_of(st.none(), st.integers(0, 5), st.just("text")), min_size=1,
                      max_size=4),
          kind=st.sampled_from(KINDS), parses=st.booleans(), hold=st.sampled_from(HOLDS))
    def publish(self, qi: int, ps: list, kind: str, parses: bool, hold: int | None) -> None:
        q = self.names[qi % len(self.names)]
        for p in ps:
            headers = {} if p is None else {"kq-priority": str(p).encode()}
            if hold is not None:
                headers["kq-not-before"] = str(self.now + hold).encode()
            payload = Doc({"p": p, "kind": kind}, headers) if parses else None
            # three partitions, and record timestamps out of arrival order, as Kafka gives them
            bm = Bookmark("T", self.offset % 3, self.offset)
            HEADERS[bm] = headers
            if payload is not None:
                DOCS[bm] = payload
            self._run(ev.MessageArrived(q, bm, self.now - 100 * (self.offset % 3), 10, payload,
                                        headers))
            self.offset += 1
            self._note_replaced(q, bm)

    def _note_replaced(self, name: str, bm: Bookmark) -> None:
        q = self.engine.queues[name]
        if q.lvq_key is None or bm not in DOCS:
            return
        key = lvq_value(q.lvq_key.evaluate(DOCS[bm]))
        if key is not None:
            self.ever_replaced.update(m.bookmark for m in q.by_seq() if m.bookmark != bm and (
                (d := doc(m)) is not None and lvq_value(q.lvq_key.evaluate(d)) == key))

    @rule(c=st.sampled_from(CLIENTS), qi=QUEUE_INDEX, b=st.integers(0, 5),
          f=st.sampled_from(FILTERS))
    def subscribe(self, c: str, qi: int, b: int, f: str | None) -> None:
        q = self.names[qi % len(self.names)]
        self._run(ev.Subscribed(c, f"{c}-{q}", q, b, "r", f))

    @rule(c=st.sampled_from(CLIENTS), qi=QUEUE_INDEX)
    def unsubscribe(self, c: str, qi: int) -> None:
        q = self.names[qi % len(self.names)]
        self._run(ev.Unsubscribed(c, f"{c}-{q}"))

    @rule(c=st.sampled_from(CLIENTS), qi=QUEUE_INDEX,
          f=st.sampled_from(FILTERS), close=st.booleans())
    def browse(self, c: str, qi: int, f: str | None, close: bool) -> None:
        q = self.names[qi % len(self.names)]
        if close:
            self._run(ev.Unsubscribed(c, f"{c}-{q}-browse"))
        else:
            self._run(ev.Subscribed(c, f"{c}-{q}-browse", q, 1, "r", f, browse=True))

    @rule(i=st.integers(0, 50), how=st.sampled_from(["ack", "cancel", "expire", "wrong-ack",
                                                     "cancel-later"]))
    def act_on_a_delivery(self, i: int, how: str) -> None:
        if not self.delivered:
            return
        c, q, bm = self.delivered[i % len(self.delivered)]
        if how == "wrong-ack":
            c = CLIENTS[(CLIENTS.index(c) + 1) % len(CLIENTS)]
        event = {"ack": ev.Acked(c, q, (bm,)), "wrong-ack": ev.Acked(c, q, (bm,)),
                 "cancel": ev.Cancelled(c, q, bm), "expire": ev.ExpireRequested(c, q, bm),
                 "cancel-later": ev.Cancelled(c, q, bm, delay_ms=2500)}[how]
        if how == "cancel-later":
            self.delays[bm] = 2500
        self._run(event)
        self.delays.pop(bm, None)  # (taken by the return, or refused)

    def _store_batch(self, cp: Checkpoint) -> None:
        cp.write(self.store, self.engine)

    @rule()
    def restart(self) -> None:
        """The service stops and starts again: a new engine loads what was written. Clients
        go on (their subscriptions were stored); every invariant must still hold."""
        self.engine = self._engine()
        load_engine(self.store, self.engine, self.now)
        self.restarted = True

    # (small steps too: a message released a millisecond early must show)
    @rule(ms=st.one_of(st.integers(0, 6000), st.sampled_from([1, 499, 500])),
          beat=st.sets(st.sampled_from(CLIENTS)))
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
    def browsers_miss_nothing_they_passed(self) -> None:
        for q in self.engine.queues.values():
            for b in q.browsers.values():
                passed = [m for m in q.by_seq() if m.seq <= b.cursor
                          and m.state.value != "sent" and b.wants(doc(m))
                          and m.bookmark not in self.ever_held
                          and m.bookmark not in self.ever_replaced]
                assert all((b.sub_id, m.bookmark) in self.browsed for m in passed), \
                    "a browser passed a queued message without being shown it"

    @invariant()
    def every_message_is_finished_or_still_queued(self) -> None:
        for name, q in self.engine.queues.items():
            assert self.enqueued[name] == self.finished[name] + len(q.messages) + q.paged
            assert q.stats.enqueued == q.stats.acked + sum(q.stats.removed.values()) \
                + len(q.messages) + q.paged

    @invariant()
    def what_queries_show_is_kept_exactly(self) -> None:
        """The counts queries read without walking the queue agree with a walk of it."""
        for q in self.engine.queues.values():
            every = list(q.by_seq())  # in memory and paged out
            live = [m.timestamp_ms for m in every if m.state.value != "sent"]
            assert q.oldest_timestamp() == (min(live) if live else None)
            lowest: dict[tuple[str, int], int] = {}
            for m in every:
                tp = (m.bookmark.topic, m.bookmark.partition)
                lowest[tp] = min(lowest.get(tp, m.bookmark.offset), m.bookmark.offset)
            assert recovery_points(q, {}) == lowest
            seqs = [m.seq for m in every]
            assert seqs == sorted(seqs), "inspect pages read the messages in seq order"

    @invariant()
    def held_ones_are_not_due_yet(self) -> None:
        """Released on time: whatever is still held is due later (time moves only with a
        tick), and the engine holds exactly the ones the model says."""
        for q in self.engine.queues.values():
            for m in q.held.values():
                assert m.not_before_ms > self.now and self.due[m.bookmark] == m.not_before_ms
            assert all(m.state.value != "available" or m.not_before_ms is None
                       or m.bookmark in q.held for m in q.messages.values())

    @invariant()
    def last_value_and_size_limits_hold(self) -> None:
        """LVQ: at most one available message per key (leased older ones may stay); ring and
        reject: never above the limit; flow-control: paused over it, resumed at 80%."""
        lvq = self.engine.queues["LVQ"]
        keys = [p for m in lvq.by_seq() if m.state.value == "available"
                and (p := (doc(m).data.get("p") if doc(m) is not None else None)) is not None]
        assert len(keys) == len(set(keys)), f"two available with one key: {keys}"
        assert self.engine.queues["RING"].depth() <= 4
        assert self.engine.queues["REJ"].depth() <= 3
        depth = self.engine.queues["FLOW"].depth()
        if depth > 3:
            assert self.flow == "pause"
        elif depth <= 2 and self.flow is not None:
            assert self.flow == "resume"

    @invariant()
    def a_group_has_one_holder(self) -> None:
        """Nobody but a group's holder holds messages of it, and the engine names the same
        holders as the rules (also after a restart)."""
        for name in GROUPED:
            for (qn, bm), sub_id in self.holder.items():
                g = group(qn, bm) if qn == name else None
                if g is not None:
                    assert self.group_holder[(name, g)] == sub_id, f"{g} has two holders"
            assert self.engine.queues[name].group_owner == {
                g: s for (qn, g), s in self.group_holder.items() if qn == name}

    @invariant()
    def nothing_waits_that_someone_with_room_wants(self) -> None:
        for q in self.engine.queues.values():
            first = q.first_barrier()
            free = [m for m in q.by_seq() if m.state.value == "available"
                    and m.not_before_ms is None and (first is None or m.seq < first.seq)]
            for s in q.subs.values():
                if s.room > 0 and s.client not in self.engine.unconfirmed:
                    assert not any(s.wants(doc(m)) and self._may_take(q.name, s.sub_id, m)
                                   for m in free), \
                        "a subscription with room is not given a message it wants"


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


class PagedQueueMachine(QueueMachine):
    """The same rules with one available message per queue in memory: the others are paged
    out (broker.engine.paging) and back in all the time; nothing may change."""

    window = 1


TestPagedQueueMachine = PagedQueueMachine.TestCase


class QpidQueueMachine(QueueMachine):
    """The same rules on the Qpid types alone (paged), so their rules are hit more often."""

    window = 1
    names = ["HOLD", "SORT", "LVQ", "RING", "REJ", "FLOW", "LEV"]


TestQpidQueueMachine = QpidQueueMachine.TestCase
TestQpidQueueMachine.settings = settings(max_examples=200, stateful_step_count=40,
                                         deadline=None)


class GroupQueueMachine(QueueMachine):
    """The same rules on the two message-group queues alone: holders and order are only
    tested when several subscriptions meet on one group queue. Two available messages per
    queue in memory: the others are paged out, where dispatch looks for groups' firsts."""

    names = sorted(GROUPED)
    window = 2


TestGroupQueueMachine = GroupQueueMachine.TestCase
TestGroupQueueMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
TestPagedQueueMachine.settings = settings(max_examples=300, stateful_step_count=40,
                                          deadline=None)


class CoalescedQueueMachine(QueueMachine):
    """The same rules with the state written as the service writes it under load: once per
    window of batches (broker.service.coalesce), the window closing at random. A restart
    loads the last write and replays the journal after it, as recovery does; the rows a
    window encodes must agree with the journal offset they are written with."""

    window = 2

    def __init__(self) -> None:
        super().__init__()
        self.states = StateWindow(window_ms=10**9)
        self.journal_tail: list[Transition] = []  # journaled after the last state write

    def _store_batch(self, cp: Checkpoint) -> None:
        self.states.add(cp, frozenset())
        self.journal_tail += cp.transitions

    @rule()
    def state_written(self) -> None:
        if self.states:
            self.states.close(self.engine)[1].write_to(self.store)
            self.journal_tail.clear()

    @rule()
    def restart(self) -> None:
        self.engine = self._engine()
        load_engine(self.store, self.engine, self.now)
        replay = Checkpoint()
        for t in self.journal_tail:
            replay.add(t, self.engine.apply(t))
        replay.write(self.store, self.engine)
        self.states, self.journal_tail = StateWindow(window_ms=10**9), []
        self.restarted = True
        self._run(ev.Tick())  # the service's first turn (held messages come due at a tick)


TestCoalescedQueueMachine = CoalescedQueueMachine.TestCase
TestCoalescedQueueMachine.settings = settings(max_examples=300, stateful_step_count=40,
                                              deadline=None)


class PriorityFilterMachine(RuleBasedStateMachine):
    """One priority queue, two clients with filters: every step exercises the ordering."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine([QUEUES["PRIO"]], heartbeat_timeout_ms=10**9)
        self.offset = 0
        self.delivered: list[tuple[str, Bookmark]] = []

    def _run(self, event: ev.Event) -> None:
        effects = self.engine.handle(event, 0)
        QueueMachine._check_order(self, effects)  # type: ignore[arg-type]
        self.delivered += [(e.client, e.bookmark) for e in effects if isinstance(e, Deliver)]

    @rule(ps=st.lists(st.one_of(st.none(), st.integers(0, 5), st.just("text")), min_size=1,
                      max_size=4), kind=st.sampled_from(KINDS))
    def publish(self, ps: list, kind: str) -> None:
        for p in ps:
            doc = Doc({"p": p, "kind": kind}, {})
            self._run(ev.MessageArrived("PRIO", Bookmark("T", 0, self.offset), 0, 10, doc))
            self.offset += 1

    @rule(c=st.sampled_from(["a", "b"]), b=st.integers(0, 3), f=st.sampled_from(FILTERS))
    def subscribe(self, c: str, b: int, f: str | None) -> None:
        self._run(ev.Subscribed(c, f"{c}-PRIO", "PRIO", b, "r", f))

    @rule(i=st.integers(0, 50), how=st.sampled_from(["ack", "cancel"]))
    def act(self, i: int, how: str) -> None:
        if self.delivered:
            c, bm = self.delivered[i % len(self.delivered)]
            self._run(ev.Acked(c, "PRIO", (bm,)) if how == "ack" else ev.Cancelled(c, "PRIO", bm))

    @rule(c=st.sampled_from(["a", "b"]))
    def unsubscribe(self, c: str) -> None:
        self._run(ev.Unsubscribed(c, f"{c}-PRIO"))


TestPriorityFilterMachine = PriorityFilterMachine.TestCase
TestPriorityFilterMachine.settings = settings(max_examples=150, stateful_step_count=30,
                                              deadline=None)
