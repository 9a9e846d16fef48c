"""How queue state is laid out in the store, and how it is written and loaded.

Keys (bytes, NUL-separated so a prefix scan never crosses into a neighbour):
  m/QUEUE/BOOKMARK   one unfinished message of a queue (StoredMessage)
  p/BOOKMARK         the record of an unfinished message, shared by every queue holding it
  s/SUB_ID           a live subscription (JSON)
  q/QUEUE            a queue's counters (StoredQueue)
  g/QUEUE/GROUP      the subscription holding a sticky message group (broker.engine.groups)
  o/READER/TOPIC/PARTITION  the next offset READER (a queue, or "" for the service's own
                     commands and forwarding) reads; -1: not read yet, start at the recovery point
  meta/journal       the journal offset, batch number and its writer this state reflects (JSON)
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from broker import wire
from broker.engine.engine import Engine
from broker.engine.ordering import STRING
from broker.engine.queue import Message, QueueState, QueueStats
from broker.engine.states import MessageState
from broker.engine.transitions import Kind, Transition
from broker.packed import (
    AVAILABLE_CODE,
    BARRIER,
    EXPIRY,
    GROUP,
    GROUPED,
    HAS_DEADLINE,
    HAS_EXPIRY,
    HAS_HOLDER,
    HAS_PRIORITY,
    HAS_SIZE,
    HELD,
    MESSAGE,
    MESSAGE_TAG,
    NOT_BEFORE,
    SIZE,
    SORT_NUMBER,
    SORT_TEXT,
    SORTED,
    WIDE,
    WIDE_TAG,
    is_packed_payload,
)
from broker.state.payload import Payload
from broker.state.store import Store
from broker.values import Bookmark

SEP: Final = b"\x00"
FINISHING: Final = frozenset({Kind.ACKED, Kind.REMOVED, Kind.RELEASED})
META_JOURNAL: Final = b"meta" + SEP + b"journal"
_UNKNOWN: Final[Any] = object()  # a transition added without its message: look it up


# (built as text and encoded once: written for every message several times)
def message_key(queue: str, bm: Bookmark) -> bytes:
    return f"m\x00{queue}\x00{bm}".encode()


def payload_key(bm: Bookmark) -> bytes:
    return f"p\x00{bm}".encode()


def sub_key(sub_id: str) -> bytes:
    return b"s" + SEP + sub_id.encode()


def queue_key(queue: str) -> bytes:
    return b"q" + SEP + queue.encode()


def group_key(queue: str, group: str) -> bytes:
    return b"g" + SEP + queue.encode() + SEP + group.encode()


# (reader, topic, partition): reader is a queue name, or "" for the service's own reading
ReaderKey = tuple[str, str, int]


def offset_key(reader: str, topic: str, partition: int) -> bytes:
    return b"o" + SEP + reader.encode() + SEP + topic.encode() + SEP + str(partition).encode()


# A queued message's record is packed with struct, not Avro (a few times cheaper; the layout
# is in broker.packed).
_STATES: Final = tuple(MessageState)
_STATE_CODE: Final = {s: i for i, s in enumerate(_STATES)}
assert _STATES[AVAILABLE_CODE] is MessageState.AVAILABLE


def encode_message(m: Message) -> bytes:
    flags = ((m.deadline_ms is not None and HAS_DEADLINE) | (m.priority is not None
             and HAS_PRIORITY) | (m.is_barrier and BARRIER) | (m.holder is not None
             and HAS_HOLDER) | (m.expires_ms is not None and HAS_EXPIRY)
             | (m.not_before_ms is not None and HELD) | (m.size > 0 and HAS_SIZE)
             | (m.sort_value is not None and SORTED) | (m.group is not None and GROUPED))
    layout, tag = (WIDE, WIDE_TAG) if flags > 255 else (MESSAGE, MESSAGE_TAG)
    head = layout.pack(tag, m.seq, m.timestamp_ms, _STATE_CODE[m.state], m.delivery_count,
                       m.cancel_count, m.deadline_ms or 0, m.priority or 0.0, flags)
    if m.expires_ms is not None:
        head += EXPIRY.pack(m.expires_ms)
    if m.not_before_ms is not None:
        head += NOT_BEFORE.pack(m.not_before_ms)
    if m.size > 0:
        head += SIZE.pack(m.size)
    if m.sort_value is not None:
        kind, value = m.sort_value
        if isinstance(value, str):
            raw = value.encode()
            head += SORT_TEXT.pack(kind, len(raw)) + raw
        else:
            head += SORT_NUMBER.pack(kind, value)
    if m.group is not None:
        raw = m.group.encode()
        head += GROUP.pack(len(raw)) + raw
    return head + m.holder.encode() if m.holder is not None else head


def decode_message(bm: Bookmark, data: bytes) -> Message:
    tag = data[:2]
    if tag != MESSAGE_TAG and tag != WIDE_TAG:
        return _decode_avro_message(bm, data)
    layout = MESSAGE if tag == MESSAGE_TAG else WIDE
    _, seq, ts, state, dc, cc, deadline, priority, flags = layout.unpack_from(data)
    rest = layout.size
    expires = None
    if flags & HAS_EXPIRY:
        (expires,) = EXPIRY.unpack_from(data, rest)
        rest += EXPIRY.size
    not_before = None
    if flags & HELD:
        (not_before,) = NOT_BEFORE.unpack_from(data, rest)
        rest += NOT_BEFORE.size
    size = 0
    if flags & HAS_SIZE:
        (size,) = SIZE.unpack_from(data, rest)
        rest += SIZE.size
    sort_value: tuple[int, float | str] | None = None
    if flags & SORTED:
        kind = data[rest]
        if kind == STRING:
            _, length = SORT_TEXT.unpack_from(data, rest)
            rest += SORT_TEXT.size
            sort_value = (kind, data[rest:rest + length].decode())
            rest += length
        else:
            _, number = SORT_NUMBER.unpack_from(data, rest)
            sort_value = (kind, number)
            rest += SORT_NUMBER.size
    group = None
    if flags & GROUPED:
        (length,) = GROUP.unpack_from(data, rest)
        rest += GROUP.size
        group = data[rest:rest + length].decode()
        rest += length
    msg = Message(bm, seq, ts, _STATES[state], dc, cc,
                  data[rest:].decode() if flags & HAS_HOLDER else None,
                  deadline if flags & HAS_DEADLINE else None)
    msg.priority = priority if flags & HAS_PRIORITY else None
    msg.is_barrier = bool(flags & BARRIER)
    msg.expires_ms = expires
    msg.not_before_ms = not_before
    msg.size = size
    msg.sort_value = sort_value
    msg.group = group
    return msg


def _decode_avro_message(bm: Bookmark, data: bytes) -> Message:
    """A message record as kq wrote it before MESSAGE_TAG (schemas/stored_message.avsc)."""
    r = wire.decode("stored_message", data)
    msg = Message(bm, r["seq"], r["timestamp_ms"], MessageState(r["state"]),
                  r["delivery_count"], r["cancel_count"], r["holder"], r["deadline_ms"])
    msg.priority, msg.is_barrier = r["priority"], r["barrier"]
    return msg


def encode_queue(q: QueueState) -> bytes:
    s = q.stats
    return wire.encode("stored_queue", {
        "next_seq": s.next_seq, "enqueued": s.enqueued, "acked": s.acked,
        "delivered": s.delivered, "dead_lettered": s.dead_lettered, "removed": dict(s.removed),
        "recovery_point": q.recovery_point, "start_ms": q.start_ms,
        "read_upto": {f"{t}/{p}": o for (t, p), o in q.read_upto.items()},
        "pending_acks": sorted(str(b) for b in q.pending_acks),
    })


def decode_queue(data: bytes, q: QueueState) -> None:
    r = wire.decode("stored_queue", data)
    q.stats = QueueStats(r["next_seq"], r["enqueued"], r["acked"], r["delivered"],
                         Counter(r["removed"]), r["dead_lettered"])
    q.recovery_point, q.start_ms = r["recovery_point"], r["start_ms"]
    for key, offset in r["read_upto"].items():
        q.read_upto[(key.rpartition("/")[0], int(key.rpartition("/")[2]))] = offset
    q.pending_acks = {Bookmark.parse(b) for b in r["pending_acks"]}


@dataclass
class Checkpoint:
    """Everything one batch changed, gathered so it can be written in one atomic batch."""

    transitions: list[Transition] = field(default_factory=list)
    # (queue, bookmark) -> the message as the batch's last transition of it left it (None:
    # finished): what the state write encodes
    messages: dict[tuple[str, Bookmark], Message | None] = field(default_factory=dict)
    payloads: dict[Bookmark, Payload] = field(default_factory=dict)
    positions: dict[ReaderKey, int] = field(default_factory=dict)
    journal_offset: int | None = None
    batch: int = 0
    writer: str | None = None  # whose batch it was (the journal's fencing rule)

    def add(self, t: Transition, msg: Message | None) -> None:
        """A transition applied, with the message `apply` returned."""
        self.transitions.append(t)
        if t.bookmark is not None and (msg is not None or t.kind in FINISHING):
            self.messages[(t.queue, t.bookmark)] = None if t.kind in FINISHING else msg

    def write(self, store: Store, engine: Engine, skip: frozenset[bytes] = frozenset()) -> None:
        """`changes` written (`skip`: keys whose write tests lose on purpose)."""
        self.changes(engine, skip).write_to(store)

    def changes(self, engine: Engine, skip: frozenset[bytes] = frozenset()) -> StateChanges:
        """The engine's current state of every key the transitions touched, encoded now (the
        engine moves on) to be written later. A message queued and finished here (acked
        within one state write's window, as most are at a steady rate) never had a row, nor
        its payload unless a queue held it before: nothing to delete."""
        puts: dict[bytes, bytes] = {}
        deletes: list[bytes] = []
        touched_queues: set[str] = set()
        touched_payloads: set[Bookmark] = set(self.payloads)
        alive: set[Bookmark] = set()  # still queued somewhere: its payload stays
        done: set[tuple[str, Bookmark]] = set()
        arrived: set[Bookmark] = set()  # queued here, by every queue it has a transition of
        held_before: set[Bookmark] = set()  # some queue had it before these transitions
        for t in self.transitions:
            name, bm = t.queue, t.bookmark
            q = engine.queues.get(name)
            if q is None:
                continue
            touched_queues.add(name)
            if bm is not None:
                at = (name, bm)
                if at in done:  # `add` kept its last state: done once
                    continue
                done.add(at)
                new = t.kind is Kind.ENQUEUED  # (its first transition here)
                (arrived if new else held_before).add(bm)
                msg = self.messages.get(at, _UNKNOWN)
                if msg is _UNKNOWN:
                    msg = None if t.kind in FINISHING else q.find(bm)
                if msg is None:
                    if not new:
                        deletes.append(message_key(name, bm))
                else:
                    puts[message_key(name, bm)] = encode_message(msg)
                    alive.add(bm)
                touched_payloads.add(bm)
            elif t.sub_id is not None:
                sub = q.subscription(t.sub_id)
                if sub is None:
                    deletes.append(sub_key(t.sub_id))
                else:
                    puts[sub_key(t.sub_id)] = json.dumps({
                        "sub_id": sub.sub_id, "client": sub.client, "queue": sub.queue,
                        "max_backlog": sub.max_backlog,
                        "filter": sub.filter.text if sub.filter else None,
                        "browse": sub.browse, "cursor": sub.cursor,
                        "principal": sub.principal}).encode()
        for bm in touched_payloads:
            # still queued somewhere? (not where this batch finished it: no pager lookup)
            if bm in alive or any(self.messages.get((name, bm), _UNKNOWN) is not None
                                  and q.queued(bm) for name, q in engine.queues.items()):
                if bm in self.payloads:
                    puts[payload_key(bm)] = self.payloads[bm].encode()
            elif bm not in arrived or bm in held_before:
                deletes.append(payload_key(bm))
        for name in touched_queues:
            q = engine.queues[name]
            puts[queue_key(name)] = encode_queue(q)
            changed, q.group_changes = q.group_changes, {}
            for group, holder in changed.items():
                if holder is None:
                    deletes.append(group_key(name, group))
                else:
                    puts[group_key(name, group)] = holder.encode()
        for (reader, topic, partition), offset in self.positions.items():
            puts[offset_key(reader, topic, partition)] = str(offset).encode()
        if self.journal_offset is not None:
            puts[META_JOURNAL] = journal_meta(self.journal_offset, self.batch, self.writer)
        if skip:
            puts = {k: v for k, v in puts.items() if k not in skip}
            deletes = [k for k in deletes if k not in skip]
        return StateChanges(puts, deletes, self.payloads)


@dataclass
class StateChanges:
    """One batch's writes, encoded, and the payloads it stores (readable before the write)."""

    puts: dict[bytes, bytes]
    deletes: list[bytes]
    payloads: dict[Bookmark, Payload]

    def write_to(self, store: Store) -> None:
        store.write(self.puts, self.deletes)


def journal_meta(offset: int, batch: int, writer: str | None) -> bytes:
    """The state's place in the journal: its last batch's last record, written with it."""
    return json.dumps({"offset": offset, "batch": batch, "writer": writer}).encode()


def load_positions(store: Store) -> dict[ReaderKey, int]:
    positions = {}
    for key, value in store.scan(b"o" + SEP):
        _, reader, topic, partition = key.split(SEP)
        positions[(reader.decode(), topic.decode(), int(partition))] = int(value)
    return positions


def load_meta(store: Store) -> dict[str, Any]:
    raw = store.get(META_JOURNAL)
    return json.loads(raw) if raw else {"offset": -1, "batch": 0}


def load_engine(store: Store, engine: Engine, now: int, paged: bool = False) -> None:
    """Fill a fresh engine with everything the store holds (`paged`: its pager holds every
    available message already, as a clean stop left it)."""
    subs_by_queue: dict[str, list[Transition]] = {}
    for _, value in store.scan(b"s" + SEP):
        s = json.loads(value)
        subs_by_queue.setdefault(s["queue"], []).append(Transition(
            Kind.SUBSCRIBED, s["queue"], now, sub_id=s["sub_id"], client=s["client"],
            max_backlog=s["max_backlog"], filter=s.get("filter"),
            browse=s.get("browse", False), seq=s.get("cursor", 0),
            principal=s.get("principal")))
    for name, q in engine.queues.items():
        raw = store.get(queue_key(name))
        if raw:
            decode_queue(raw, q)
        prefix = b"m" + SEP + name.encode() + SEP
        skip = len(prefix)
        records = ((k[skip:].decode(), v) for k, v in store.scan(prefix))
        held = b"g" + SEP + name.encode() + SEP
        holders = {k[len(held):].decode(): v.decode() for k, v in store.scan(held)}
        engine.restore_stored(name, records, _load_stored, subs_by_queue.get(name, []), now,
                              holders, paged)


def _load_stored(bm_text: str, data: bytes) -> Message:
    return decode_message(Bookmark.parse(bm_text), data)


def load_packed_payload(store: Store | None, bm: Bookmark) -> bytes | None:
    """A stored payload as a delivery envelope carries it, without unpacking it."""
    assert store is not None
    raw = store.get(payload_key(bm))
    if raw is None or is_packed_payload(raw):
        return raw
    return Payload.decode(raw).encode()  # written before payloads were packed


def load_payload(store: Store | None, bm: Bookmark) -> Payload | None:
    raw = load_packed_payload(store, bm)  # (one written before packing: packed now)
    return Payload.decode(raw) if raw else None
