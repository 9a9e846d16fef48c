"""What a queue does with a message it has just enqueued: the admitting part of its type.

A part of the engine (its base class). Each rule runs right after the ENQUEUED transition,
and what it decides is journaled like everything else:

  last value   `lvq_key`: the newest message per key replaces an older one that is not
               leased (removed, reason `replaced`; not a failure, not dead-lettered). A
               leased one stays, and if it comes back it is replaced then. A NULL key
               never replaces. (Qpid's last-value queue)
  ring         over `max_messages` / `max_bytes`: the oldest available messages leave,
               lowest priority first (reason `overflow-ring`), until the queue fits.
  reject       over a limit: the newcomer leaves at once (reason `overflow`).
  flow-control over a limit: a `pause` record on PREFIX.flow; at or below 80% of every
               limit: `resume`. Messages are still enqueued (`Flow` effects, checked
               whenever the queue changed).
"""

from __future__ import annotations

import json
from typing import Any, Final

from mypy_extensions import trait

from broker.engine.effects import Flow
from broker.engine.part import EnginePart
from broker.engine.queue import Message, QueueState
from broker.engine.states import MessageState
from broker.engine.transitions import Reason
from broker.expr import Doc

RESUME_AT: Final = 0.8  # flow-control resumes at or below this share of every limit


def lvq_value(value: Any) -> Any:
    """A key for the value an `lvq_key` expression gave (None: no key): equal values of one
    kind are one key, whatever their representation (1 and 1.0; a JSON object's key order)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", float(value))
    if isinstance(value, str):
        return ("s", value)
    return ("j", json.dumps(value, sort_keys=True))


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class Admission(EnginePart):
    def _admit(self, q: QueueState, msg: Message, doc: Doc | None, now: int) -> None:
        if q.lvq_key is not None:
            self._replace_older(q, msg, doc, now)
        policy = q.config.overflow_policy
        if policy == "reject" and over_limit(q) and q.find(msg.bookmark) is not None:
            self._remove(q, msg, now, Reason.OVERFLOW)
        elif policy == "ring":
            while over_limit(q):
                victim = ring_victim(q) or q.find(msg.bookmark)
                if victim is None:
                    break
                self._remove(q, victim, now, Reason.OVERFLOW_RING)

    # -- last value ------------------------------------------------------------------------
    def _lvq_of(self, q: QueueState, msg: Message, doc: Doc | None = None) -> Any:
        assert q.lvq_key is not None
        doc = doc if doc is not None else self.doc_of(q, msg)
        return lvq_value(q.lvq_key.evaluate(doc)) if doc is not None else None

    def _latest(self, q: QueueState, arriving: Any = None) -> dict[Any, Any]:
        """The newest message per key, built from the queue's messages when not known yet
        (but for the one `arriving`, whose older one is wanted)."""
        if q.latest is None:
            q.latest = {}
            for m in q.by_seq():
                if m.state is not MessageState.SENT and m.bookmark != arriving and (
                        key := self._lvq_of(q, m)) is not None:
                    q.latest[key] = m.bookmark
        return q.latest

    def _replace_older(self, q: QueueState, msg: Message, doc: Doc | None, now: int) -> None:
        key = self._lvq_of(q, msg, doc)
        if key is None:
            return
        latest = self._latest(q, arriving=msg.bookmark)
        before = latest.get(key)
        older = q.find(before) if before is not None and before != msg.bookmark else None
        latest[key] = msg.bookmark
        if older is not None and older.state is MessageState.AVAILABLE:
            self._remove(q, older, now, Reason.REPLACED)

    def _replaced_since(self, q: QueueState, msg: Message) -> bool:
        """A leased message of a last-value queue coming back: whether a newer one with its
        key is queued (it is then removed as replaced instead of returned)."""
        if q.lvq_key is None:
            return False
        key = self._lvq_of(q, msg)
        newest = self._latest(q).get(key) if key is not None else None
        return newest is not None and newest != msg.bookmark and q.find(newest) is not None

    # -- flow control ----------------------------------------------------------------------
    def _check_flow(self, q: QueueState, now: int) -> None:
        """Tell PREFIX.flow when the queue goes over a limit and when it is back at 80%."""
        if over_limit(q):
            paused = True
        elif within(q, RESUME_AT):
            paused = False
        else:
            paused = q.flow_paused if q.flow_paused is not None else False
        if paused != q.flow_paused:
            q.flow_paused = paused
            self._out.append(Flow(q.name, "pause" if paused else "resume", q.depth(),
                                  q.byte_count, now))


def over_limit(q: QueueState) -> bool:
    cfg = q.config
    return ((cfg.max_messages is not None and q.depth() > cfg.max_messages)
            or (cfg.max_bytes is not None and q.byte_count > cfg.max_bytes))


def within(q: QueueState, share: float) -> bool:
    cfg = q.config
    return ((cfg.max_messages is None or q.depth() <= share * cfg.max_messages)
            and (cfg.max_bytes is None or q.byte_count <= share * cfg.max_bytes))


def ring_victim(q: QueueState) -> Message | None:
    """The oldest available message of the lowest priority there is (barriers aside)."""
    q.refill()
    if not q.ranked:  # arrival order: the first available one
        return next((m for m in q.available.values() if not m.is_barrier), None)
    if q.sorted_by is not None:  # by key, not priority: the oldest (not paged: ranked)
        return min((m for m in q.available.values() if not m.is_barrier),
                   key=lambda m: m.seq, default=None)
    # ranked ring queues are not paged: every available message is in `available`
    lowest = next((m.order[0] for m in q.available.values_reversed() if not m.is_barrier),
                  None)
    if lowest is None:
        return None
    return next((m for k in q.available.keys_from((lowest, -1))
                 if not (m := q.available[k]).is_barrier), None)
