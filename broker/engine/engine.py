"""The queue engine: `Engine.handle(event, now_ms) -> list[Effect]`.

Sans-I/O: time is passed in, nothing is read from or written to the outside world. Every
decision becomes a `Transition` applied to a `QueueState` and emitted as a `Journal` effect;
deliveries, dead letters and replies are emitted after the transitions they depend on.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from broker.config import QueueConfig
from broker.engine import events as ev
from broker.engine import queue as queue_module
from broker.engine.acks import Acks, Sweep
from broker.engine.admission import Admission
from broker.engine.dispatch import Dispatcher
from broker.engine.effects import (
    CommandRejected,
    DeadLetter,
    Defer,
    Effect,
    Journal,
    Reply,
    Resume,
)
from broker.engine.holds import hold_until, redelivery_delay_ms
from broker.engine.paging import MemoryPager, Pager
from broker.engine.queue import NOT_DEAD_LETTERED, Message, QueueState, Subscription
from broker.engine.states import MessageState
from broker.engine.timers import Timers
from broker.engine.transitions import Kind, Reason, Transition
from broker.engine.ttl import own_expiry
from broker.errors import ExpressionError
from broker.expr import Doc, compile_expression
from broker.values import Bookmark

DocLoader = Callable[[str, Bookmark], Doc | None]


class Engine(Timers, Dispatcher, Acks, Admission):
    def __init__(self, queues: Iterable[QueueConfig], heartbeat_timeout_ms: int = 10_000,
                 max_message_bytes: int = 1_000_000,
                 auth: dict[str, str] | None = None,
                 doc_loader: DocLoader | None = None, pager: Pager | None = None,
                 window: int | None = None) -> None:
        # Available messages beyond each queue's window wait in the pager (the service's is
        # RocksDB; by default they stay in memory all the same).
        self.pager = pager or MemoryPager()
        window = window or queue_module.WINDOW
        self.queues: dict[str, QueueState] = {q.name: QueueState(q, self.pager, window)
                                              for q in queues}
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.max_message_bytes = max_message_bytes
        # principal -> queues it may read; None: no [auth], everybody reads everything
        self.auth = {p: re.compile(r) for p, r in auth.items()} if auth else None
        # Without a loader every message keeps its Doc in memory; with one (the service's,
        # reading the store) nothing is kept and filters ask the loader.
        self.doc_loader = doc_loader
        self.subs: dict[str, Subscription] = {}  # every subscription, by id
        self.sub_ids_of: dict[str, set[str]] = {}  # client -> ids of its subscriptions
        self.last_seen: dict[str, int] = {}  # client -> last time it was heard from
        self.speakers: dict[str, tuple[str, str, bool]] = {}  # client -> its processes
        # Clients whose subscriptions were restored after a restart and who have not been
        # heard from since: they may be gone, so nothing is dispatched to them until they are.
        self.unconfirmed: set[str] = set()
        self._out: list[Effect] = []
        self._touched: set[str] = set()
        self._sweeps: list[Sweep] = []

    # -- the one entry point ---------------------------------------------------------------
    def handle(self, event: ev.Event, now: int) -> list[Effect]:
        self._out = []
        self._touched = set()
        # an arrival has no client: asked first, as a getattr that misses raises and catches
        client = None if isinstance(event, ev.MessageArrived) else getattr(event, "client", None)
        if client is not None and self.auth is not None and not self._owned_by_sender(event):
            return self._out
        if client is not None:
            self.last_seen[client] = now
            if client in self.unconfirmed:
                self.unconfirmed.discard(client)
                self._touched.update(s.queue for s in self.subs.values() if s.client == client)
        match event:
            case ev.MessageArrived():
                self._arrive(event, now)
            case ev.Subscribed():
                self._subscribe(event, now)
            case ev.Unsubscribed():
                self._unsubscribe(event, now)
            case ev.ClientClosed():
                self._drop_client(event.client, now, Reason.UNSUBSCRIBED)
                self.last_seen.pop(event.client, None)
                self.speakers.pop(event.client, None)
            case ev.Heartbeat():
                self._heard(event.client, event.instance)
            case ev.Acked():
                self._ack(event, now)
            case ev.Cancelled():
                self._cancel(event, now)
            case ev.ExpireRequested():
                self._expire(event, now)
            case ev.Extended():
                self._extend(event, now)
            case ev.AckWhere():
                self._ack_where(event, now)
            case ev.Configured():
                self._configure(event, now)
            case ev.Tick():
                self._tick(now)
            case ev.Proceed():
                self._sweep_on(now)
        for name in sorted(self._touched):
            q = self.queues[name]
            if q.browsers:  # first: browsers see what consumers are about to take away
                self._browse(q, now)
            self._dispatch(q, now)
            if q.deferring and not q.full:
                q.deferring = False
                self._out.append(Resume(name))
            if q.config.overflow_policy == "flow-control":
                self._check_flow(q, now)
        return self._out

    def use_pager(self, pager: Pager) -> None:
        """Page out to `pager` from now on (before any message is queued)."""
        self.pager = pager
        for q in self.queues.values():
            assert not q.messages and not q.paged, "use_pager on a queue already in use"
            if q.pager is not None:
                q.pager = pager

    def apply(self, t: Transition) -> Message | None:
        """Apply one journaled transition (used live and by recovery)."""
        q = self.queues.get(t.queue)
        if q is None:  # the queue was removed from the config since this was journaled
            return None
        if t.kind is Kind.SUBSCRIBED:
            q.apply(t)
            sub = q.subscription(t.sub_id or "")
            assert sub is not None
            self.subs[sub.sub_id] = sub
            self.sub_ids_of.setdefault(sub.client, set()).add(sub.sub_id)
            return None
        if t.kind is Kind.UNSUBSCRIBED:
            gone = self.subs.pop(t.sub_id or "", None)
            ids = self.sub_ids_of.get(gone.client, set()) if gone is not None else set()
            ids.discard(t.sub_id or "")
            if gone is not None and not ids:
                self.sub_ids_of.pop(gone.client, None)
        return q.apply(t)

    def resets(self, effects: list[Effect]) -> set[str]:
        """The queues these effects start again from a new recovery point."""
        return {e.transition.queue for e in effects if isinstance(e, Journal)
                and e.transition.kind is Kind.CONFIGURED and e.transition.seq == 1}

    # -- internals -------------------------------------------------------------------------
    def _do(self, t: Transition) -> Message | None:
        msg = self.apply(t)
        self._out.append(Journal(t, msg))
        self._touched.add(t.queue)
        return msg

    def _reject(self, client: str, request_id: str, message: str) -> None:
        self._out.append(CommandRejected(client, request_id, message))

    def _queue(self, name: str, client: str, request_id: str,
               principal: str | None = None) -> QueueState | None:
        """The queue a command names, if it exists and the sender may read it. `principal`:
        who sent it as far as the shell knows (None: the client's name; "": nobody vouches)."""
        q = self.queues.get(name)
        if q is None:
            known = ", ".join(sorted(self.queues)) or "none"
            self._reject(client, request_id, f"unknown queue {name!r} (the shard it would be "
                         f"in serves: {known}; `kq queues` lists them all)")
            return None
        who = client if principal is None else principal
        if self.auth is not None and not who:
            self._reject(client, request_id, f"not entitled: queue {name!r} takes commands only "
                         "on the sender's own command topic (PREFIX.commands.<principal>)")
            return None
        if self.auth is not None and not self.entitled(who, name):
            self._reject(client, request_id, f"not entitled: {who!r} may not read queue {name!r}")
            return None
        return q

    def _owned_by_sender(self, event: ev.Event) -> bool:
        """Under [auth], a client with subscriptions belongs to the principal that made them:
        a command naming it from anyone else (an ack of its leases, a close, a heartbeat
        keeping it alive) is refused, so one principal cannot act as another's client."""
        client: str = getattr(event, "client")  # noqa: B009 - every command names one
        principal = getattr(event, "principal", None)
        sender = client if principal is None else principal
        owner = next((s.principal for s in self.subs.values()
                      if s.client == client and s.principal is not None), None)
        if owner is None or owner == sender:
            return True
        request_id = getattr(event, "request_id", "")
        if request_id:
            self._reject(client, request_id, f"not entitled: client {client!r} belongs to "
                         f"principal {owner!r}")
        return False

    def doc_of(self, q: QueueState, msg: Message, now: int | None = None) -> Doc | None:
        """What expressions see of a queued message (with `now`: NOW() is that time)."""
        doc = msg.doc
        if doc is None and self.doc_loader is not None:
            doc = self.doc_loader(q.name, msg.bookmark)
        if doc is None or now is None:
            return doc
        return Doc(doc.data, doc.headers, now)

    def entitled(self, principal: str, queue: str) -> bool:
        """With [auth]: whether the principal's pattern allows reading (and acking) the queue."""
        if self.auth is None:
            return True
        pattern = self.auth.get(principal)
        return pattern is not None and pattern.search(queue) is not None

    def _arrive(self, e: ev.MessageArrived, now: int) -> None:
        q = self.queues.get(e.queue)
        ts = e.timestamp_ms if e.timestamp_ms > 0 else now
        if q is None or ts < q.start_ms or q.queued(e.bookmark):
            return
        if q.full:
            q.deferring = True
            self._out.append(Defer(q.name, e.bookmark))
            return
        headers = e.headers if e.headers is not None else e.doc.headers if e.doc else {}
        rank = q.ordering.rank(e.doc, headers)  # a sorted queue's may be a string
        barrier = e.doc is not None and q.barrier is not None and q.barrier.matches(e.doc)
        msg = self._do(Transition(Kind.ENQUEUED, q.name, now, e.bookmark, seq=q.stats.next_seq,
                                  timestamp_ms=ts, barrier=barrier,
                                  priority=None if isinstance(rank, str) else rank,
                                  sort_text=rank if isinstance(rank, str) else None,
                                  deadline_ms=own_expiry(q.config, ts, headers),
                                  # (a barrier goes by its own rule: never held)
                                  not_before_ms=None if barrier else hold_until(q.config, now,
                                                                                headers),
                                  size=e.size if q.config.max_bytes is not None else None,
                                  group=q.group_value(e.doc)))
        if msg is not None and self.doc_loader is None:
            msg.doc = e.doc
        if msg is not None and msg.bookmark in q.pending_acks:
            self._do(Transition(Kind.ACKED, q.name, now, msg.bookmark, client="remembered"))
            return
        if e.size > self.max_message_bytes and msg is not None:
            # it could never be delivered: account for it at once instead of retrying forever
            self._remove(q, msg, now, Reason.TOO_LARGE)
        elif msg is not None:
            self._admit(q, msg, e.doc, now)  # last value, size limits (engine.admission)

    def _subscribe(self, e: ev.Subscribed, now: int) -> None:
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        if e.max_backlog < 0:
            self._reject(e.client, e.request_id, f"max_backlog must be >= 0, got {e.max_backlog}")
            return
        if e.filter:
            try:
                compile_expression(e.filter)
            except ExpressionError as exc:
                self._reject(e.client, e.request_id, f"bad filter: {exc}")
                return
        # a nondestructive queue is only browsed, whatever mode was asked for (Qpid)
        browse = e.browse or q.config.nondestructive
        replay_ms = e.replay_ms
        if replay_ms is None and browse and q.config.default_replay_period is not None:
            replay_ms = q.config.default_replay_period.ms  # Qpid's default filter
        if replay_ms is not None and (not browse or replay_ms < 0):
            self._reject(e.client, e.request_id, "replay_period needs mode='browse' and a "
                         f"duration >= 0, got {replay_ms} ms")
            return
        existing = self.subs.get(e.sub_id)
        if existing is not None and (existing.client != e.client or existing.queue != e.queue
                                     or existing.browse != browse):
            self._reject(e.client, e.request_id, f"subscription id {e.sub_id!r} is taken")
            return
        if existing is None:
            self._do(
                Transition(
                    Kind.SUBSCRIBED, q.name, now, sub_id=e.sub_id, client=e.client,
                    max_backlog=e.max_backlog, filter=e.filter or None, browse=browse,
                    seq=q.browse_start(now - replay_ms if replay_ms is not None else None)
                    if browse else 0, principal=e.principal,
                )
            )
        sub = self.subs[e.sub_id]
        self._out.append(
            Reply(e.client, e.request_id, {"sub_id": e.sub_id, "queue": q.name,
                                            "backlog": sub.cap,
                                            "mode": "browse" if sub.browse else "queue",
                                            "heartbeat_ms": self.heartbeat_timeout_ms})
        )

    def _unsubscribe(self, e: ev.Unsubscribed, now: int) -> None:
        sub = self.subs.get(e.sub_id)
        if sub is not None and sub.client != e.client:
            self._reject(e.client, e.request_id, f"subscription {e.sub_id} is not yours")
            return
        if sub is not None:
            self._end_subscription(sub, now, Reason.UNSUBSCRIBED)
        if e.request_id:
            self._out.append(Reply(e.client, e.request_id, {"sub_id": e.sub_id}))

    def _end_subscription(self, sub: Subscription, now: int, reason: Reason) -> None:
        """Leases held by an ended subscription return at once."""
        q = self.queues[sub.queue]
        for bm in sorted(sub.held, key=lambda b: q.messages[b].seq):
            self._give_back(q, q.messages[bm], now, reason)
        self._do(Transition(Kind.UNSUBSCRIBED, q.name, now, sub_id=sub.sub_id, client=sub.client))

    def _give_back(self, q: QueueState, msg: Message, now: int, reason: Reason,
                   cancel_count: int | None = None, delay_ms: int | None = None) -> None:
        """A lease ends without an ack: the message returns (after its redelivery delay:
        `delay_ms`, else the queue's), or leaves by policy."""
        if msg.state is MessageState.SENT:
            self._do(Transition(Kind.RELEASED, q.name, now, msg.bookmark, reason=reason.value))
            return
        cc = msg.cancel_count if cancel_count is None else cancel_count
        cfg = q.config
        expires = q.expires_at(msg)
        why: Reason | None = None
        if reason is Reason.CANCELLED and cfg.max_cancels and cc > cfg.max_cancels:
            why = Reason.MAX_CANCELS
        elif cfg.max_deliveries and msg.delivery_count >= cfg.max_deliveries:
            why = Reason.MAX_DELIVERIES
        elif expires is not None and expires <= now:
            why = Reason.EXPIRED
        elif self._replaced_since(q, msg):
            why = Reason.REPLACED  # a last-value queue has a newer one with its key
        if why is not None:
            self._remove(q, msg, now, why, cancel_count=cc)
        else:
            delay = delay_ms if delay_ms is not None else (
                redelivery_delay_ms(q.config, msg.delivery_count)
                if reason in (Reason.CANCELLED, Reason.LAPSED) else 0)  # (a close: at once)
            self._do(Transition(Kind.RETURNED, q.name, now, msg.bookmark, cancel_count=cc,
                                reason=reason.value,
                                not_before_ms=now + delay if delay > 0 else None))

    def _remove(self, q: QueueState, msg: Message, now: int, why: Reason,
                cancel_count: int | None = None) -> None:
        cc = msg.cancel_count if cancel_count is None else cancel_count
        dc = msg.delivery_count
        if q.config.dead_letter_topic and why.value not in NOT_DEAD_LETTERED:
            # Copied before the removal is journaled: a crash between them duplicates, not loses.
            self._out.append(DeadLetter(q.name, msg.bookmark, q.config.dead_letter_topic,
                                        why.value, dc, cc))
        self._do(Transition(Kind.REMOVED, q.name, now, msg.bookmark, cancel_count=cc,
                            reason=why.value))

    def _configure(self, e: ev.Configured, now: int) -> None:
        """A new queue starts at its recovery point; a changed one starts again from it."""
        q = self.queues.get(e.queue)
        if q is None or q.recovery_point == e.recovery_point:
            return
        reset = q.recovery_point is not None
        if reset:
            for msg in list(q.by_seq()):
                kind = Kind.RELEASED if msg.state is MessageState.SENT else Kind.REMOVED
                self._do(Transition(kind, q.name, now, msg.bookmark, reason=Reason.RESET.value))
        # seq=1 marks a reset: the shell rewinds the queue's input positions with it
        self._do(Transition(Kind.CONFIGURED, q.name, now, reason=e.recovery_point,
                            timestamp_ms=e.start_ms, seq=int(reset)))

    # -- recovery --------------------------------------------------------------------------
    def restore(self, queue: str, messages: Iterable[Message], subs: Iterable[Transition],
                now: int, holders: dict[str, str] | None = None) -> None:
        """Load one queue's stored state (messages first, then their subscriptions, then
        who holds its message groups: `holders`, the sticky ones the store kept)."""
        self.queues[queue].restore(messages)
        self._restored(self.queues[queue], subs, now, holders)

    def restore_stored(self, queue: str, records: Iterable[tuple[str, bytes]],
                       load: Callable[[str, bytes], Message], subs: Iterable[Transition],
                       now: int, holders: dict[str, str] | None = None,
                       paged: bool = False) -> None:
        """`restore` from the store's records as they are (see QueueState.restore_stored)."""
        self.queues[queue].restore_stored(records, load, paged)
        self._restored(self.queues[queue], subs, now, holders)

    def _restored(self, q: QueueState, subs: Iterable[Transition], now: int,
                  holders: dict[str, str] | None) -> None:
        q.release_due(now)  # held until a moment that passed meanwhile
        for t in subs:
            self.apply(t)
            self.last_seen.setdefault(t.client or "", now)
            self.unconfirmed.add(t.client or "")
        if q.group_expr is not None:
            q.restore_holders([m for m in q.messages.values() if m.holder is not None],
                              holders or {}, set(q.subs))

    def queue(self, name: str) -> QueueState:
        return self.queues[name]
