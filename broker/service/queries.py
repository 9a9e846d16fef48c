"""Answers to the CLI's read-only queries, computed from the engine's state."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from broker.engine.engine import Engine
from broker.engine.ordering import NUMBER, STRING
from broker.engine.queue import Message, QueueState
from broker.engine.states import MessageState
from broker.errors import CommandError, ExpressionError
from broker.expr import compile_expression
from broker.values import Bookmark


def queue_row(q: QueueState, now: int, subscribers: int) -> dict[str, Any]:
    oldest = q.oldest_timestamp()
    return {
        "queue": q.name,
        "semantics": q.config.semantics,
        "underlying_topic": q.config.topic_regex.pattern,
        "depth": q.depth(),
        "available": q.available_count(),
        "leased": q.leased_count(),
        "held": len(q.held),
        "groups_held": len(q.group_owner),  # message groups a subscription holds
        "subscribers": subscribers,
        "oldest_age_ms": None if oldest is None else max(0, now - oldest),
        "enqueued": q.stats.enqueued,
        "delivered": q.stats.delivered,
        "acked": q.stats.acked,
        "removed": dict(q.stats.removed),
        "dead_lettered": q.stats.dead_lettered,
    }


HELD = "held"  # not a state of the machine: an available message not due yet (engine.holds)
PositionsOf = Callable[[str], dict[tuple[str, int], int]]
SNAPSHOT = "snapshot"  # answered between batches, by `snapshot`, not by `answer`
SNAPSHOT_ROWS_PER_REPLY = 5_000


def snapshot(engine: Engine, batch: int, shard: int = 0) -> list[dict[str, Any]]:
    """Every queue's messages and counters as they stand after journal batch `batch`, for
    `kq journal audit`, in reply chunks. One walk of every queue: an audit is asked for by
    a person, not polled."""
    counters = {name: {"enqueued": q.stats.enqueued, "acked": q.stats.acked,
                       "removed": dict(q.stats.removed)} for name, q in engine.queues.items()}
    rows = []
    for name, q in engine.queues.items():
        for m in q.by_seq():
            holder = engine.subs.get(m.holder) if m.holder else None
            rows.append([name, str(m.bookmark), m.state.value, m.delivery_count,
                         m.cancel_count, holder.client if holder else None])
    chunks = [rows[i:i + SNAPSHOT_ROWS_PER_REPLY]
              for i in range(0, len(rows), SNAPSHOT_ROWS_PER_REPLY)] or [[]]
    first = {"batch": batch, "shard": shard, "queues": counters,
             "columns": ["queue", "bookmark", "state", "delivery_count", "cancel_count",
                         "holder"]}
    return [{**(first if i == 0 else {}), "chunk": i, "chunks": len(chunks), "rows": chunk}
            for i, chunk in enumerate(chunks)]


def answer(engine: Engine, args: dict[str, Any], now: int, positions: PositionsOf,
           where: dict[str, Any] | None = None) -> dict[str, Any]:
    """`where`: the shard and its owner, added to each queue row."""
    what = args.get("what")
    if what == "queues":
        return {"queues": [{**queue_row(q, now, len(q.subs)), **(where or {})}
                           for q in engine.queues.values()]}
    if what == "inspect":
        return _inspect(engine, args, now, positions)
    if what == "subscribers":
        name = args.get("queue")
        if name and name not in engine.queues:
            raise CommandError(f"unknown queue {name!r}")
        rows = [
            {"sub_id": s.sub_id, "client": s.client, "queue": s.queue,
             "mode": "browse" if s.browse else "queue",
             "max_backlog": s.max_backlog, "backlog": s.cap, "leased": len(s.held),
             # a browser's: the messages enqueued since the last it was shown
             "to_browse": (max(0, engine.queues[s.queue].stats.next_seq - 1 - s.cursor)
                           if s.browse else 0),
             "last_heartbeat_ms": engine.last_seen.get(s.client)}
            for s in engine.subs.values() if not name or s.queue == name
        ]
        return {"subscribers": rows}
    if what == "recovery_points":
        rows = [{"queue": name, "topic": t, "partition": p, "offset": o}
                for name, q in engine.queues.items()
                for (t, p), o in sorted(recovery_points(q, positions(name)).items())]
        return {"recovery_points": rows}
    raise CommandError(f"unknown query {what!r}")


# An inspect with --filter reads each message it looks at from the store: it looks at no more
# than this many per query, so a filter that matches little on a deep queue cannot stall the
# service (the answer says it stopped early).
FILTER_SCAN_LIMIT = 1_000


def _candidates(q: QueueState, state: str | None) -> Iterator[Message]:
    """The queue's messages in seq order, narrowed to a state without walking the queue
    where it can: leased and sent ones are what the subscriptions hold."""
    if state == HELD:
        return iter(sorted(q.held.values(), key=lambda m: m.seq))
    if state in (MessageState.LEASED, MessageState.SENT):
        held = (q.messages[bm] for sub in q.subs.values() for bm in sub.held
                if bm in q.messages)
        return (m for m in sorted(held, key=lambda m: m.seq) if m.state == state)
    # in seq order; for "available" this skips only leased ones
    return (m for m in q.by_seq() if state is None or shown_state(m) == state)


def sort_key_of(m: Message) -> float | str | None:
    """A sorted queue's message: its key (None: it has none)."""
    if m.sort_value is None or m.sort_value[0] not in (NUMBER, STRING):
        return None
    return m.sort_value[1]


def shown_state(m: Message) -> str:
    """A message's state as `kq inspect` shows it: available ones still held are `held`."""
    return HELD if m.not_before_ms is not None else m.state.value


def _inspect(engine: Engine, args: dict[str, Any], now: int,
             positions: PositionsOf) -> dict[str, Any]:
    name = args.get("queue", "")
    q = engine.queues.get(name)
    if q is None:
        raise CommandError(f"unknown queue {name!r} (known queues: {', '.join(engine.queues)})")
    state = args.get("state") or None
    if state and state not in (HELD, *(s.value for s in MessageState)):
        raise CommandError(f"unknown state {state!r}: the states are "
                           f"{', '.join((*(s.value for s in MessageState), HELD))}")
    limit = int(args.get("limit") or 100)
    if limit < 1:
        raise CommandError(f"limit must be at least 1, not {limit}")
    try:
        where = compile_expression(args["filter"]) if args.get("filter") else None
    except ExpressionError as exc:
        raise CommandError(str(exc)) from None
    rows: list[dict[str, Any]] = []
    scanned, truncated = 0, False
    for m in _candidates(q, state):
        if len(rows) >= limit:
            truncated = True
            break
        if where is not None:
            if scanned >= FILTER_SCAN_LIMIT:
                truncated = True
                break
            scanned += 1
            doc = engine.doc_of(q, m)
            if doc is None or not where.matches(doc):
                continue
        holder = engine.subs.get(m.holder) if m.holder else None
        rows.append({
            "bookmark": str(m.bookmark), "state": shown_state(m), "seq": m.seq,
            "age_ms": max(0, now - m.timestamp_ms), "delivery_count": m.delivery_count,
            "cancel_count": m.cancel_count, "holder": holder.client if holder else None,
            "sub_id": m.holder, "lease_deadline_ms": m.deadline_ms, "priority": m.priority,
            "not_before_ms": m.not_before_ms, "sort_key": sort_key_of(m),
            "group": q.group_of(m),
        })
    points = recovery_points(q, positions(name))
    return {
        "summary": queue_row(q, now, len(q.subs)),
        "messages": rows,
        # whether it stopped before the end of the queue: at the limit, or with a filter
        # after looking at FILTER_SCAN_LIMIT messages ("scanned"); more may match
        "truncated": truncated,
        "scanned": scanned,
        "recovery_points": [{"topic": t, "partition": p, "offset": o}
                            for (t, p), o in sorted(points.items())],
        "groups": _groups(engine, q, limit),
    }


def _groups(engine: Engine, q: QueueState, limit: int) -> list[dict[str, Any]]:
    """The message groups a subscription holds (the first `limit` taken: no walk of
    every group)."""
    rows = []
    for group, sub_id in islice(q.group_owner.items(), limit):
        sub = engine.subs.get(sub_id)
        head = q.group_head.get(group)
        rows.append({"group": group, "sub_id": sub_id, "holder": sub.client if sub else None,
                     "next": str(head.bookmark) if head else None})
    return rows


def recovery_points(q: QueueState, positions: dict[tuple[str, int], int]
                    ) -> dict[tuple[str, int], int]:
    """Per source partition of a queue: the offset below which every message is finished."""
    points = dict(positions)
    for (topic, partition), offsets in q.offsets.items():
        first = offsets.first(lambda o, t=topic, p=partition:  # type: ignore[misc]
                              q.find(Bookmark(t, p, o)) is not None)
        if first is not None:
            points[(topic, partition)] = min(points.get((topic, partition), first), first)
    return points
