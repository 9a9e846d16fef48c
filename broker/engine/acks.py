"""What a subscriber does with a message it was given: ack (by bookmark or by filter), cancel,
expire. A part of the engine (its base class); `leasing` decides whose leases one may settle.
"""

from __future__ import annotations

from itertools import islice, takewhile
from typing import Final

from mypy_extensions import trait

from broker.engine import events as ev
from broker.engine.effects import Reply
from broker.engine.part import EnginePart
from broker.engine.queue import Message, QueueState
from broker.engine.states import MessageState
from broker.engine.transitions import Kind, Reason, Transition
from broker.errors import ExpressionError
from broker.expr import Expression, compile_expression
from broker.values import Bookmark

# Messages an ack by filter looks at per engine event: about 40 ms of the shard's loop
# compiled (each one's payload is read and decoded), so a deep queue's scan lets the queues
# around it go on between its parts.
SWEEP_PART: Final = 1000


class Sweep:
    """An ack by filter under way: it covers the messages queued when it was asked for
    (seq up to `upto`), and has looked at those up to `cursor`."""

    __slots__ = ("queue", "client", "request_id", "expr", "upto", "cursor", "acked")

    def __init__(self, queue: str, client: str, request_id: str, expr: Expression,
                 upto: int) -> None:
        self.queue, self.client, self.request_id = queue, client, request_id
        self.expr, self.upto = expr, upto
        self.cursor = -1
        self.acked = 0


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class Acks(EnginePart):
    def _held_message(self, q: QueueState, client: str, bm: Bookmark, verb: str,
                      delivery: int = 0) -> tuple[Message | None, str | None]:
        """The message `client` may act on, or the reason it may not. With `delivery` (the
        delivery count the client was given), only that delivery: an answer to an earlier
        one, whose lease lapsed, is never applied to a later one."""
        msg = q.find(bm)
        if msg is None:
            return None, f"{verb} {bm}: not in queue {q.name} (already acked, removed or unknown)"
        if delivery and delivery != msg.delivery_count:
            return None, (f"{verb} {bm}: lease lost: delivery {delivery} of it is over (its "
                          f"lease lapsed or was given up; it is now delivery "
                          f"{msg.delivery_count}, {msg.state.value})")
        if delivery and msg.state is MessageState.AVAILABLE:
            return None, (f"{verb} {bm}: lease lost: delivery {delivery} of it is over (its "
                          f"lease lapsed, or went back when its subscription or client "
                          f"closed; it is available again)")
        holder = self.subs.get(msg.holder) if msg.holder else None
        if holder is not None and holder.client == client:
            return msg, None
        if q.config.leasing == "permissive" and any(
            s.client == client for s in q.subs.values()
        ):
            return msg, None
        if msg.state is MessageState.AVAILABLE:
            return None, f"{verb} {bm}: not leased to {client} (it is available)"
        if q.config.leasing == "permissive":  # (a subscriber of the queue would have been let)
            return None, (f"{verb} {bm}: leased to another subscriber, and {client} does not "
                          f"subscribe to {q.name} (leasing is permissive: its subscribers may)")
        return None, f"{verb} {bm}: leased to another subscriber (leasing is strict)"

    def _ack(self, e: ev.Acked, now: int) -> None:
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        problems = []
        counts = e.delivery_counts or (0,) * len(e.bookmarks)
        for bm, delivery in zip(e.bookmarks, counts, strict=True):
            if q.not_read_yet(bm) and q.find(bm) is None:
                if bm not in q.pending_acks:  # honoured when the message becomes active
                    self._do(Transition(Kind.REMEMBERED, q.name, now, bm, client=e.client))
                continue
            msg, problem = self._held_message(q, e.client, bm, "ack", delivery)
            if problem:
                problems.append(problem)
            elif msg is not None:
                self._do(Transition(Kind.ACKED, q.name, now, bm, client=e.client))
        if problems:
            self._reject(e.client, e.request_id, "; ".join(problems))
        elif e.request_id:
            self._out.append(Reply(e.client, e.request_id, {"acked": len(e.bookmarks)}))

    def _ack_where(self, e: ev.AckWhere, now: int) -> None:
        """Ack every active message the expression matches that `client` may ack: those
        queued when asked, read in arrival order a part at a time (`_sweep_on`), so that a
        deep queue's scan does not hold up the rest of the shard."""
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        try:
            expr = compile_expression(e.expression)
        except ExpressionError as exc:
            self._reject(e.client, e.request_id, str(exc))
            return
        self._sweeps.append(Sweep(q.name, e.client, e.request_id, expr, q.stats.next_seq - 1))
        self._sweep_on(now)

    def sweeping(self) -> bool:
        """Whether an ack by filter is under way: `ev.Proceed` carries it on."""
        return bool(self._sweeps)

    def _sweep_on(self, now: int) -> None:
        """The next part of every ack by filter under way; the answer when one is done."""
        for s in list(self._sweeps):
            q = self.queues.get(s.queue)
            examined = self._sweep_part(q, s, now) if q is not None else 0
            if examined < SWEEP_PART:  # nothing left before the last seq asked about
                self._sweeps.remove(s)
                if s.request_id:
                    self._out.append(Reply(s.client, s.request_id, {"acked": s.acked}))

    def _sweep_part(self, q: QueueState, s: Sweep, now: int) -> int:
        """Ack what the next SWEEP_PART messages of the sweep hold for it; how many it
        looked at (fewer: it is done). Strict leasing: available messages and the client's
        own leases; permissive: any."""
        permissive = q.config.leasing == "permissive"
        own = {sub.sub_id for sub in q.subs.values() if sub.client == s.client}
        part = list(islice(takewhile(lambda m: m.seq <= s.upto, q.by_seq(s.cursor)),
                           SWEEP_PART))
        chosen = [
            m for m in part
            if m.state is not MessageState.SENT
            and (doc := self.doc_of(q, m, now)) is not None and s.expr.matches(doc)
            and (m.state is MessageState.AVAILABLE or m.holder in own or permissive)
        ]
        for m in chosen:
            self._do(Transition(Kind.ACKED, q.name, now, m.bookmark, client=s.client))
        s.acked += len(chosen)
        if part:
            s.cursor = part[-1].seq
        return len(part)

    def _cancel(self, e: ev.Cancelled, now: int) -> None:
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        msg, problem = self._held_message(q, e.client, e.bookmark, "cancel", e.delivery_count)
        if problem or msg is None:
            self._reject(e.client, e.request_id, problem or "")
        elif msg.state is MessageState.AVAILABLE:
            self._reject(e.client, e.request_id, f"cancel {e.bookmark}: it is not leased")
        else:
            self._give_back(q, msg, now, Reason.CANCELLED, cancel_count=msg.cancel_count + 1,
                            delay_ms=e.delay_ms)

    def _expire(self, e: ev.ExpireRequested, now: int) -> None:
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        msg, problem = self._held_message(q, e.client, e.bookmark, "expire", e.delivery_count)
        if problem or msg is None:
            self._reject(e.client, e.request_id, problem or "")
        elif msg.state is MessageState.SENT:
            self._do(Transition(Kind.RELEASED, q.name, now, msg.bookmark,
                                reason=Reason.EXPIRE_REQUESTED.value))
        else:
            self._remove(q, msg, now, Reason.EXPIRE_REQUESTED)

    def _extend(self, e: ev.Extended, now: int) -> None:
        """Renew a lease the client holds, to now + the period asked (also past the queue's
        lease_period); the reply carries the new deadline."""
        q = self._queue(e.queue, e.client, e.request_id, e.principal)
        if q is None:
            return
        msg, problem = self._held_message(q, e.client, e.bookmark, "extend", e.delivery_count)
        if problem or msg is None:
            self._reject(e.client, e.request_id, problem or "")
        elif msg.state is not MessageState.LEASED:
            self._reject(e.client, e.request_id, f"extend {e.bookmark}: lease lost: it has no "
                                                 f"lease to extend ({msg.state.value})")
        elif e.period_ms <= 0:
            self._reject(e.client, e.request_id, f"extend {e.bookmark}: the period must be "
                                                 f"more than 0 ms, not {e.period_ms}")
        else:
            deadline = now + e.period_ms
            self._do(Transition(Kind.EXTENDED, q.name, now, msg.bookmark, sub_id=msg.holder,
                                client=e.client, delivery_count=msg.delivery_count,
                                deadline_ms=deadline))
            if e.request_id:
                self._out.append(Reply(e.client, e.request_id, {"deadline_ms": deadline}))
