"""The service's pager (broker.engine.paging): paged-out messages in a RocksDB of their own.

It is swap space, not state: it lives in `DATA_DIR/pager` and is written without a write-ahead
log. A start empties it (the service pages the queues out again as it loads them from its
store), unless the last stop was clean: a clean stop pages out every available message and
leaves a marker (`keep`) naming the state it matches (the store's journal offset, and each
queue's count and ranking), and a start whose store and queues still match uses the pager as
it is (broker.service.swap). Opening removes the marker for good first, so after a crash the
pager is rebuilt. Keys, each prefixed by the queue's name and a NUL:
  o ORDER      the message (its packed record, its packed payload when it was in hand at
               page-out, its bookmark), in delivery order
  b BOOKMARK   its ORDER
  s SEQ        its ORDER, in arrival order, for a message with a priority or a sort key
               only: the ORDER of one without either is its SEQ (the o keys of those are
               already in arrival order, and `by_seq` merges both)
  t AT SEQ     a timer: the bookmark of the message due at AT (expiry), earliest first
ORDER sorts as `Message.order` does: highest priority first (NULL last), then seq; in a
sorted queue by the sort key's kind, then its number or its UTF-8 (a NUL escaped, so a
shorter string sorts before a longer one it starts), then seq.
"""

from __future__ import annotations

import heapq
import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from rocksdict import Rdict, WriteBatch, WriteOptions

from broker.engine.queue import Message
from broker.state.held import HeldPayloads
from broker.state.layout import decode_message, encode_message
from broker.state.pager_rows import NO_PRIORITY, SEQ, fields, order_key, row, row_message
from broker.state.rocks import MemtableShedder, bounded_options
from broker.values import Bookmark

SEP: Final = b"\x00"
PENDING_LIMIT: Final = 4096  # puts held back before they are written
_TIME, _TIME_BIAS = struct.Struct(">Q"), 1 << 63  # a signed time, as bytes that sort as it
NEVER: Final = (1 << 63) - 1  # the next timer's time, for a queue with none


def _no_payload(bm: Bookmark) -> bytes | None:
    return None


def _seq_of(item: tuple[int, bytes]) -> int:
    return item[0]


KEPT: Final = b"\xffkept"  # the marker of a clean stop (after every queue's keys)
# The keys' layout, named in the marker of a clean stop: a pager kept by a kq that laid its
# keys out otherwise (1: an s key for every message; 2: no payloads in the rows) is rebuilt,
# not read.
LAYOUT: Final = 3


class RocksPager:
    def __init__(self, path: str | Path, memory_budget: int, reuse: bool = False) -> None:
        """`reuse`: read what a clean stop kept (`kept`), for the caller to check before it
        loads its engine (broker.service.swap.use_kept_pager); otherwise start empty."""
        self._path, self._budget = Path(path), memory_budget
        # The payloads of messages being paged out, when the service still has them in hand
        # (an arrival's, in its batch): a page-out writes each into the message's row, so
        # that its delivery reads it from memory rather than from the store (a RocksDB get).
        self.payload_source: Callable[[Bookmark], bytes | None] = _no_payload
        self._held = HeldPayloads()  # those of the rows paged back in (taken by `payload`)
        self._db = self._open(fresh=not reuse)
        # What the last clean stop left (see the module's doc); None: the pager starts empty
        self.kept: dict[str, Any] | None = None
        self._counts: dict[str, int] = {}
        raw = self._db.get(KEPT) if reuse else None
        try:
            if raw is not None:
                self.kept = json.loads(bytes(raw))
                self._counts = {q: int(v["count"]) for q, v in self.kept["queues"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            self.kept = None
        if self.kept is None and reuse:
            self.discard()
        elif self.kept is not None:  # gone for good before any change: a crash rebuilds it
            self._db.delete(KEPT)
            self._db.flush(True)
        # Per queue, a key at or below every live `o` key: seeks start there, not at the
        # prefix, so they do not wade through the deleted entries before it (a queue takes
        # from the front: RocksDB keeps tombstones until compaction).
        self._low: dict[str, bytes] = {}
        self._timers_low: dict[str, bytes] = {}  # the same for the timers
        # Per queue, a time before which no timer is due (none: not known, so look): every
        # tick asks, and an idle queue's answer costs no seek into RocksDB this way.
        self._timers_next: dict[str, int] = {}
        # Puts wait in one write batch until a read needs them (or it holds PENDING_LIMIT):
        # a queue fed faster than it drains pages out one message per arrival, and RocksDB
        # writes them together several times faster than one by one.
        self._pending = WriteBatch(raw_mode=True)
        self._pending_items = 0
        self._shedder = MemtableShedder()

    def _open(self, fresh: bool) -> Rdict:
        if fresh:
            shutil.rmtree(self._path, ignore_errors=True)
        self._path.mkdir(parents=True, exist_ok=True)
        db = Rdict(str(self._path), bounded_options(self._budget))
        no_log = WriteOptions()
        no_log.disable_wal = True  # type: ignore[method-assign, assignment]  # a property
        db.set_write_options(no_log)
        return db

    def discard(self) -> None:
        """Start empty: what the pager holds is not the state the service loads."""
        self._db.close()
        self._db = self._open(fresh=True)
        self.kept, self._counts = None, {}
        self._held.clear()

    def keep(self, marker: dict[str, Any]) -> None:
        """At a clean stop, every available message paged out: leave `marker` (each queue's
        count added) for the next start, on disk with everything written before it."""
        self._flush()
        marker["queues"] = {q: {**v, "count": self._counts.get(q, 0)}
                            for q, v in marker["queues"].items()}
        self._db.put(KEPT, json.dumps(marker).encode())
        self._db.flush(True)

    def _pended(self, n: int) -> None:
        """`n` more puts wait in the batch: written once there are PENDING_LIMIT."""
        self._pending_items += n
        if self._pending_items >= PENDING_LIMIT:
            self._flush()

    def _flush(self) -> None:
        if self._pending_items:
            self._db.write(self._pending)
            self._pending = WriteBatch(raw_mode=True)
            self._pending_items = 0

    def _lower(self, queue: str, key: bytes) -> None:
        low = self._low.get(queue)
        if low is None or key < low:
            self._low[queue] = key

    def _from(self, queue: str) -> bytes:
        return self._low.get(queue) or self._key(b"o", queue, b"")

    def shed_memory(self) -> bool:
        """Idle: what is held is given back (a payload then comes from the store)."""
        self._flush()
        self._held.clear()
        return self._shedder.shed(self._db)

    def payload(self, bm: Bookmark) -> bytes | None:
        """The packed payload of a message paged back in, if its row had it: handed over
        once (a redelivery reads it from the store)."""
        return self._held.take(bm)

    def _payload_out(self, msg: Message) -> bytes:
        """What a page-out writes into `msg`'s row: its payload if held or in hand."""
        return self.payload(msg.bookmark) or self.payload_source(msg.bookmark) or b""

    def close(self) -> None:
        self._flush()
        self._db.close()

    @staticmethod
    def _key(kind: bytes, queue: str, rest: bytes) -> bytes:
        return kind + queue.encode() + SEP + rest

    def put(self, queue: str, msg: Message) -> None:
        self.put_many(queue, [msg])

    def put_many(self, queue: str, msgs: list[Message]) -> None:
        self._put_rows(queue, [(m.order, m.seq, str(m.bookmark), encode_message(m),
                                self._payload_out(m)) for m in msgs])

    def put_raw_many(self, queue: str, items: list[tuple[Any, int, str, bytes]],
                     load: Any = None) -> None:
        """Records as the store holds them (packed): copied, not decoded (their payloads
        stay in the store)."""
        self._put_rows(queue, [(*item, b"") for item in items])

    def _put_rows(self, queue: str, items: list[tuple[Any, int, str, bytes, bytes]]) -> None:
        if not items:
            return
        put, head = self._pending.put, queue.encode() + SEP
        o, b, s, pack_seq = b"o" + head, b"b" + head, b"s" + head, SEQ.pack
        lowest = None
        for order, seq, text, packed, payload in items:
            key = order_key(order)
            bm = text.encode()
            if lowest is None or key < lowest:
                lowest = key
            put(o + key, row(packed, payload, bm))
            put(b + bm, key)
            if not key.startswith(NO_PRIORITY):  # (in arrival order, the o key says it)
                put(s + pack_seq(seq), key)
        assert lowest is not None  # (items is not empty)
        self._lower(queue, o + lowest)
        self._pended(len(items))
        self._counts[queue] = self._counts.get(queue, 0) + len(items)

    def _drop(self, batch: WriteBatch, queue: str, order: bytes, msg: Message) -> None:
        batch.delete(self._key(b"o", queue, order))
        batch.delete(self._key(b"b", queue, str(msg.bookmark).encode()))
        if not order.startswith(NO_PRIORITY):
            batch.delete(self._key(b"s", queue, SEQ.pack(msg.seq)))
        self._counts[queue] -= 1

    def get(self, queue: str, bm: Bookmark) -> Message | None:
        self._flush()
        order = self._db.get(self._key(b"b", queue, str(bm).encode()))
        if order is None:
            return None
        data = self._db.get(self._key(b"o", queue, bytes(order)))
        return None if data is None else row_message(bytes(data))

    def take(self, queue: str, bm: Bookmark) -> Message | None:
        self._flush()
        order: bytes | None = self._db.get(self._key(b"b", queue, str(bm).encode()))
        data: bytes | None = order and self._db.get(self._key(b"o", queue, order))
        if order is None or data is None:
            return None
        packed, payload, _ = fields(data)
        msg = decode_message(bm, packed)
        if payload:
            self._held.hold(bm, payload)
        batch = WriteBatch(raw_mode=True)
        self._drop(batch, queue, order, msg)
        self._db.write(batch)
        return msg

    def _scan(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._flush()
        for key, value in self._db.items(from_key=start):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode
            if not key.startswith(prefix):
                return
            yield key, value

    def take_first(self, queue: str, limit: int) -> list[Message]:
        head = queue.encode() + SEP
        prefix, by_bm, by_seq = b"o" + head, b"b" + head, b"s" + head
        out: list[Message] = []
        keys: list[bytes] = []
        batch = WriteBatch(raw_mode=True)
        delete = batch.delete
        rows: list[tuple[bytes, bytes, bytes]] = []  # (bm: the text, as its `b` key holds it)
        # (from below every live key, not the prefix: the front's deleted keys are tombstones
        # a seek from the prefix would step over, one by one, until they are compacted)
        for key, value in self._scan(prefix, self._from(queue)):
            if len(keys) >= limit:
                break
            keys.append(key)
            rows.append(fields(value))
        if not keys:
            return out
        # parsed together: the topic and partition once per run of them (mostly one run)
        bookmarks = Bookmark.parse_many([bm.decode() for _, _, bm in rows])
        for key, (packed, payload, bm), bookmark in zip(keys, rows, bookmarks, strict=True):
            msg = decode_message(bookmark, packed)
            if payload:
                self._held.hold(bookmark, payload)
            out.append(msg)
            delete(by_bm + bm)
            if not key.startswith(NO_PRIORITY, len(prefix)):
                delete(by_seq + SEQ.pack(msg.seq))
        # What was taken is the front of the o keys: deleted as one range (each key written
        # to RocksDB costs its memtable an insert, a range one). One in arrival order has no
        # s key.
        batch.delete_range(keys[0], keys[-1] + SEP)
        self._counts[queue] -= len(out)
        self._db.write(batch)
        return out

    def first_order(self, queue: str) -> Any:
        prefix = self._key(b"o", queue, b"")
        for key, value in self._scan(prefix, self._from(queue)):
            self._low[queue] = key
            return row_message(value).order
        return None

    def after(self, queue: str, order: Any, limit: int) -> list[Message]:
        prefix = self._key(b"o", queue, b"")
        start = self._from(queue) if order is None else max(
            self._from(queue), prefix + order_key(order) + b"\x00")
        out: list[Message] = []
        for _, value in self._scan(prefix, start):
            if len(out) >= limit:
                break
            out.append(row_message(value))
        return out

    def by_seq(self, queue: str, after_seq: int) -> Iterator[Message]:
        """The queue's paged-out messages after `after_seq`, in arrival order: those in
        arrival order by their o keys, the others by their s keys, merged."""
        for _, value in heapq.merge(self._plain_by_seq(queue, after_seq),
                                    self._ranked_by_seq(queue, after_seq), key=_seq_of):
            yield row_message(value)

    def _plain_by_seq(self, queue: str, after_seq: int) -> Iterator[tuple[int, bytes]]:
        """(seq, o value) of the messages in arrival order (no s keys): their o keys."""
        prefix = self._key(b"o", queue, NO_PRIORITY)
        start = max(self._from(queue), prefix + SEQ.pack(after_seq + 1))
        for key, value in self._scan(prefix, start):
            yield SEQ.unpack_from(key, len(prefix))[0], value

    def _ranked_by_seq(self, queue: str, after_seq: int) -> Iterator[tuple[int, bytes]]:
        """(seq, o value) of the messages with s keys, in arrival order."""
        prefix = self._key(b"s", queue, b"")
        for key, order in self._scan(prefix, prefix + SEQ.pack(after_seq + 1)):
            data = self._db.get(self._key(b"o", queue, order))
            if data is not None:
                yield SEQ.unpack_from(key, len(prefix))[0], bytes(data)

    def count(self, queue: str) -> int:
        return self._counts.get(queue, 0)

    def add_timer(self, queue: str, at: int, seq: int, bm: Bookmark) -> None:
        key = self._key(b"t", queue, _TIME.pack(at + _TIME_BIAS) + SEQ.pack(seq))
        low = self._timers_low.get(queue)
        if low is not None and key < low:
            self._timers_low[queue] = key
        if at < self._timers_next.get(queue, at):
            self._timers_next[queue] = at
        self._pending.put(key, str(bm).encode())
        self._pended(1)

    def due_timers(self, queue: str, now: int, limit: int) -> list[tuple[int, int, Bookmark]]:
        if now < self._timers_next.get(queue, now):
            return []
        prefix = self._key(b"t", queue, b"")
        out: list[tuple[int, int, Bookmark]] = []
        batch = WriteBatch(raw_mode=True)
        # (from below every live timer, not the prefix: the deleted ones are tombstones)
        for key, value in self._scan(prefix, self._timers_low.get(queue, prefix)):
            (biased,) = _TIME.unpack_from(key, len(prefix))
            at = biased - _TIME_BIAS
            if at > now or len(out) >= limit:
                self._timers_low[queue], self._timers_next[queue] = key, at
                break
            (seq,) = SEQ.unpack_from(key, len(prefix) + _TIME.size)
            out.append((at, seq, Bookmark.parse(value.decode())))
            batch.delete(key)
            self._timers_low[queue] = key + b"\x00"
        else:
            self._timers_next[queue] = NEVER
        if out:
            self._db.write(batch)
        return out
