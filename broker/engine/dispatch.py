"""Handing available messages to subscriptions: order, filters, fairness, barriers.

A part of the engine (its base class), kept apart because it is the one hot loop.
"""

from __future__ import annotations

from itertools import islice
from typing import Final

from mypy_extensions import trait

from broker.engine.effects import Deliver
from broker.engine.fairness import PICKERS
from broker.engine.ordered import OrderIndex
from broker.engine.part import EnginePart
from broker.engine.queue import Message, QueueState, Subscription
from broker.engine.states import MessageState
from broker.engine.transitions import Kind, Reason, Transition
from broker.expr import Expression
from broker.values import Bookmark

# Copies one browser is sent per engine step: a browser of a deep queue is caught up over
# several batches instead of one huge one.
BROWSE_BATCH: Final = 500
# Paged-out messages one filter looks at per dispatch, when nothing in memory matches it: a
# filter matching little on a deep queue is served over several ticks, never stalling one.
PAGED_SCAN: Final = 1_000
# Messages a dispatch for filters reading the clock looks at: the first ones, and a further
# stretch of the rest (see `_dispatch_walking`).
WALK_FRONT: Final = 500
WALK_ON: Final = 500
# Heads of message groups a filtered subscription looks at per dispatch, in its own groups
# and in the free ones (broker.engine.groups).
GROUP_LOOK: Final = 1_000


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class Dispatcher(EnginePart):
    def _dispatch(self, q: QueueState, now: int) -> None:
        """Hand available messages, oldest first, to subscriptions with room."""
        pick = PICKERS[q.fairness]
        while True:
            q.refill()
            if not q.available or not q.subs:
                q.matching.clear()
                q.fresh.clear()
                return
            subs = [s for s in q.subs.values() if s.client not in self.unconfirmed]
            if q.group_expr is not None:
                self._dispatch_grouped(q, subs, now)  # (never barriers: config refuses them)
                return
            filters = [s.filter for s in subs if s.filter is not None]
            barrier = q.first_barrier()
            if any(f.uses_time for f in filters):
                q.matching.clear()
                q.fresh.clear()
                sent = self._dispatch_walking(q, subs, barrier, now)
            elif filters or barrier:
                sent = self._dispatch_indexed(q, subs, barrier, now)
            else:
                q.matching.clear()  # no filter needs them now: rebuilt when one comes
                q.fresh.clear()
                q.filter_scan.clear()
                while (sub := pick(subs, q.rr_last)) is not None:
                    q.refill()
                    if not q.available:
                        break
                    self._lease(q, sub, q.available.peekitem(0)[1], now)
                return
            if not sent:
                return  # else a barrier went out: what waited behind it may go now

    def _dispatch_indexed(self, q: QueueState, subs: list[Subscription],
                          barrier: Message | None, now: int) -> bool:
        """Filters or a barrier, no clock: repeatedly the best dispatchable message some
        subscription with room wants (each filter's index has its best at the head), to one
        of those by fairness: the same choices as walking the queue, at O(log n) each. With
        a barrier only what came before it (a priority queue keeps just those dispatchable;
        otherwise the order is the arrival order and dispatch stops at the barrier); then
        the barrier, if everything before it is finished. True when a barrier was sent."""
        self._sync_matching(q, subs)
        pick = PICKERS[q.fairness]
        while True:
            if q.refill():
                self._sync_matching(q, subs)  # the filters see what came back first
            with_room = [s for s in subs if s.room > 0]
            for s in with_room:
                if s.filter is not None and not q.matching[s.filter.text]:
                    self._look_in_pager(q, s.filter)
            sources = [q.dispatchable if s.filter is None else q.matching[s.filter.text]
                       for s in with_room]
            heads = [src.peekitem(0) for src in sources if src]
            if barrier is not None:  # in arrival order: a head behind it has only such behind
                heads = [head for head in heads if head[1].seq < barrier.seq]
            if not heads:
                break
            order, msg = min(heads, key=lambda head: head[0])
            takers = [s for s, src in zip(with_room, sources, strict=True) if order in src]
            sub = pick(takers, q.rr_last)
            if sub is None:
                break
            self._lease(q, sub, msg, now)  # the message leaves the available ones either way
        return barrier is not None and self._send_barrier(q, barrier, subs, now)

    def _dispatch_grouped(self, q: QueueState, subs: list[Subscription], now: int) -> None:
        """Message groups (broker.engine.groups): repeatedly the best message a subscription
        with room may take (the first head among its own groups' and the free ones that its
        filter takes), to one of the subscriptions it is best for, by fairness."""
        pick = PICKERS[q.fairness]
        said: dict[tuple[str, Bookmark], bool] = {}  # what filters said, for this dispatch
        took_from_scan = False
        while True:
            q.refill()
            best: Message | None = None
            takers: list[Subscription] = []
            for sub in subs:
                if sub.room <= 0:
                    continue
                msg = self._first_for(q, sub, now, said)
                if msg is None or (best is not None and best.order < msg.order):
                    continue
                if msg is best:
                    takers.append(sub)
                else:
                    best, takers = msg, [sub]
            if best is None:  # nothing in memory for anyone with room: the pager, then
                best, takers = self._group_head_in_pager(q, subs, now) or (None, [])
                took_from_scan = took_from_scan or best is not None
            chosen = pick(takers, q.rr_last) if best is not None else None
            if best is None or chosen is None:
                if took_from_scan:
                    # What the scan passed was refused by those with room then; within this
                    # dispatch they only lose room, so it went on from there. The next one
                    # may have new takers (a subscription, room, a group let go): it starts
                    # again. (A scan that found nothing in its budget goes on: see below.)
                    q.group_scan = None
                    q.group_seen.clear()
                return
            self._lease(q, chosen, best, now)  # (from the pager: paged in, then leased)

    def _group_head_in_pager(self, q: QueueState, subs: list[Subscription],
                             now: int) -> tuple[Message, list[Subscription]] | None:
        """The first paged-out message that is its group's first and that a subscription
        with room may take, with those subscriptions; looking at no more than PAGED_SCAN
        (then None: the scan goes on from there next time, a tick included)."""
        with_room = [s for s in subs if s.room > 0]
        if not with_room or not q.paged or q.pager is None:
            return None
        budget, asked = PAGED_SCAN, 16  # read in growing pages: the first is usually it
        while budget > 0:
            from_start = q.group_scan is None
            asked = min(budget, asked * 2)
            page = q.pager.after(q.name, q.group_scan, asked)
            budget -= len(page)
            for msg in page:
                q.group_scan = msg.order
                group = q.group_of(msg)
                if group is not None and (group in q.group_head or group in q.group_seen):
                    continue  # not its group's first
                if group is not None:
                    q.group_seen.add(group)
                holder = q.holder_of(msg)
                doc = self.doc_of(q, msg, now) if any(s.filter for s in with_room) else None
                takers = [s for s in with_room if holder in (None, s.sub_id) and s.wants(doc)]
                if takers:
                    q.group_seen.discard(group or "")  # (taken: the next one is its first)
                    return msg, takers
            if len(page) < asked:  # the end: round again, from the start
                q.group_scan = None
                q.group_seen.clear()
                if from_start:
                    break
        return None

    def _first_for(self, q: QueueState, sub: Subscription, now: int,
                   said: dict[tuple[str, Bookmark], bool]) -> Message | None:
        """The first head `sub` may take: of a group it holds, or free. A filtered one looks
        at no more than GROUP_LOOK heads of each."""
        found = None
        for heads in (q.group_owned.get(sub.sub_id), q.group_free):
            if not heads:
                continue
            looked = islice(heads.values(), 1 if sub.filter is None else GROUP_LOOK)
            msg = next((m for m in looked if self._takes(q, sub, m, now, said)), None)
            if msg is not None and (found is None or msg.order < found.order):
                found = msg
        return found

    def _takes(self, q: QueueState, sub: Subscription, msg: Message, now: int,
               said: dict[tuple[str, Bookmark], bool]) -> bool:
        if sub.filter is None:
            return True
        key = (sub.filter.text, msg.bookmark)
        wanted = said.get(key)
        if wanted is None:
            wanted = said[key] = sub.wants(self.doc_of(q, msg, now))
        return wanted

    def _look_in_pager(self, q: QueueState, expr: Expression) -> None:
        """A filter nothing in memory matches: its first match among the paged-out messages
        becomes its candidate (leased, if chosen, straight from the pager)."""
        msg = q.paged_matches(expr.text, expr, lambda m: self.doc_of(q, m), PAGED_SCAN)
        if msg is not None:
            q.matching[expr.text][msg.order] = msg

    def _sync_matching(self, q: QueueState, subs: list[Subscription]) -> None:
        """Bring each filter's index up to date: messages made available since the last look
        are checked once (a message's payload does not change, so neither does the result);
        a filter new to the queue is checked against every available message."""
        wanted = {s.filter.text: s.filter for s in subs if s.filter is not None}
        for text in [t for t in q.matching if t not in wanted]:
            del q.matching[text]
            q.filter_scan.pop(text, None)
        fresh, q.fresh = q.fresh, []
        if q.matching:
            for msg in fresh:
                if q.dispatchable.get(msg.order) is not msg or msg.is_barrier:
                    continue  # left again before anyone looked; barriers have their rule
                doc = self.doc_of(q, msg)
                for text, index in q.matching.items():
                    if doc is not None and wanted[text].matches(doc):
                        index[msg.order] = msg
        for text, expr in wanted.items():
            if text not in q.matching:
                q.filter_scan[text] = None
                found = q.matching[text] = OrderIndex()
                for order, m in q.dispatchable.items():
                    if (not m.is_barrier and (doc := self.doc_of(q, m)) is not None
                            and expr.matches(doc)):
                        found[order] = m

    def _dispatch_walking(self, q: QueueState, subs: list[Subscription],
                          barrier: Message | None, now: int) -> bool:
        """In queue order, each message to a subscription with room whose filter it matches;
        a message nobody wants waits. For filters that read the clock: their answers change
        while messages wait, so no index holds and the queue is walked. A bounded walk: the
        first WALK_FRONT messages, then the next WALK_ON of the rest (in memory, then paged
        out) from where the last walk stopped, round and round, so a deep queue costs the
        same per step and a match at its back is found within a few rounds. Then the
        barrier, if everything before it is finished. True when a barrier was sent."""
        front = q.available.first_values(WALK_FRONT)
        if self._walk(q, subs, barrier, front, now):
            # after the front, and after where the last walk stopped
            marks = [o for o in (front[-1].order if front else None, q.clock_scan)
                     if o is not None]
            start = max(marks) if marks else None
            on: list[Message] = []
            if start is None or (q.available and start < q.available.peekitem(-1)[0]):
                keys = iter(q.available) if start is None else q.available.keys_after(start)
                on = [q.available[k] for _, k in zip(range(WALK_ON), keys, strict=False)]
            if len(on) < WALK_ON and q.paged and q.pager is not None:
                after = on[-1].order if on else start
                on += q.pager.after(q.name, after, WALK_ON - len(on))
            q.clock_scan = on[-1].order if len(on) == WALK_ON else None  # else: round again
            self._walk(q, subs, barrier, on, now)
        return barrier is not None and self._send_barrier(q, barrier, subs, now)

    def _walk(self, q: QueueState, subs: list[Subscription], barrier: Message | None,
              msgs: list[Message], now: int) -> bool:
        """`_dispatch_walking` over these messages. False once no subscription has room."""
        pick = PICKERS[q.fairness]
        for msg in msgs:
            if msg.is_barrier or (barrier is not None and msg.seq > barrier.seq):
                continue  # barriers go by their own rule; the others wait behind the first
            with_room = [s for s in subs if s.room > 0]
            if not with_room:
                return False
            doc = self.doc_of(q, msg, now) if any(s.filter for s in with_room) else None
            takers = [s for s in with_room if s.wants(doc)]
            sub = pick(takers, q.rr_last) if takers else None
            if sub is not None:
                self._lease(q, sub, msg, now)
        return True

    def _send_barrier(self, q: QueueState, barrier: Message, subs: list[Subscription],
                      now: int) -> bool:
        """Once everything before it is finished: to every current subscription whose filter
        it matches, whatever their backlog, then gone without an ack."""
        if not subs or not q.clear_before(barrier):
            return False
        doc = self.doc_of(q, barrier, now) if any(s.filter for s in subs) else None
        for sub in subs:
            if sub.wants(doc):
                self._out.append(Deliver(sub.client, sub.sub_id, q.name, barrier.bookmark, 1,
                                         None, is_barrier=True, seq=barrier.seq))
        self._do(Transition(Kind.REMOVED, q.name, now, barrier.bookmark, delivery_count=1,
                            reason=Reason.BARRIER_SENT.value))
        return True

    def _browse(self, q: QueueState, now: int) -> None:
        """Show each browser, in arrival order, a copy of every message still in the queue
        that its filter takes; nothing is leased and no count changes. At most BROWSE_BATCH
        copies per browser at a time: the rest follow on the next tick."""
        last = q.stats.next_seq - 1
        for b in q.browsers.values():
            if b.looked_upto >= last or b.client in self.unconfirmed:
                continue
            shown, looked = b.cursor, 0
            for msg in q.by_seq(b.looked_upto):
                if looked == BROWSE_BATCH:
                    break
                looked += 1
                shown = msg.seq
                if (msg.state is MessageState.SENT or msg.not_before_ms is not None
                        or self._replaced_since(q, msg)):
                    continue  # at-most-once: gone; held: not yet; or an older last value
                if b.filter is None or b.wants(self.doc_of(q, msg, now)):
                    self._out.append(Deliver(b.client, b.sub_id, q.name, msg.bookmark,
                                             msg.delivery_count, None, msg.is_barrier, msg.seq))
            if looked:
                self._do(Transition(Kind.BROWSED, q.name, now, sub_id=b.sub_id,
                                    client=b.client, seq=shown))
            if looked < BROWSE_BATCH:
                b.looked_upto = last  # the rest up to the last seq has finished

    def _lease(self, q: QueueState, sub: Subscription, msg: Message, now: int) -> None:
        """Lease (or, at-most-once, send) `msg` to `sub`, unless it expired meanwhile."""
        expires = q.expires_at(msg)
        if expires is not None and expires <= now:
            self._remove(q, msg, now, Reason.EXPIRED)
            return
        at_most_once = q.at_most_once
        q.rr_last = sub.sub_id
        dc = msg.delivery_count + 1
        deadline = now + q.lease_ms
        kind = Kind.SENT if at_most_once else Kind.LEASED
        self._do(Transition(kind, q.name, now, msg.bookmark, sub_id=sub.sub_id,
                            client=sub.client, delivery_count=dc, deadline_ms=deadline))
        self._out.append(Deliver(sub.client, sub.sub_id, q.name, msg.bookmark, dc,
                                 None if at_most_once else deadline, seq=msg.seq))

