"""Deliveries packed into envelopes: one Kafka record carries many messages for one subscription.

A record per message costs the service a produce call and a delivery report, and the client a
fetch entry and a decode, whatever the message's size; packing a batch's deliveries to one
subscription into one `messages` envelope pays those once. The envelope's columns are packed
arrays and the payloads go in as stored (`broker.packed`), so a delivery costs no Avro work.
A record never grows past the largest one kq may write: a pack that would is closed and the
next one started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from broker import wire
from broker.packed import delivery_batch
from broker.service.commit import OutRecord

# What an envelope adds around its payloads, and each delivery (bookmark, counts): generous,
# so a pack always stays under the record size limit.
ENVELOPE_OVERHEAD: Final = 1024
DELIVERY_OVERHEAD: Final = 512


@dataclass
class _Pack:
    bookmarks: list[str] = field(default_factory=list)
    delivery_counts: list[int] = field(default_factory=list)
    lease_deadlines: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    barriers: list[int] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    size: int = 0

    def encode(self, sub_id: str, queue: str, fmt: str) -> bytes:
        return wire.encode("envelope", {
            "kind": "messages", "sub_id": sub_id, "queue": queue, "format": fmt,
            "batch": ("kq.DeliveryBatch", delivery_batch(  # (the union's branch named: not
                self.bookmarks, self.delivery_counts, self.lease_deadlines,  # looked for)
                self.seqs, self.barriers, self.payloads))})


class Envelopes:
    """The deliveries of one batch, grouped by subscription, in the order they were made."""

    def __init__(self, max_record_bytes: int) -> None:
        self._max = max_record_bytes - ENVELOPE_OVERHEAD
        # (topic, sub_id, queue, format) -> its packs, the last one open
        self._packs: dict[tuple[str, str, str, str], list[_Pack]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic: str, sub_id: str, queue: str, fmt: str, bookmark: str,
            delivery_count: int, lease_deadline_ms: int | None, is_barrier: bool, seq: int,
            payload: bytes) -> None:
        packs = self._packs.get((topic, sub_id, queue, fmt))
        if packs is None:
            packs = self._packs[(topic, sub_id, queue, fmt)] = [_Pack()]
        size = len(payload) + DELIVERY_OVERHEAD
        pack = packs[-1]
        if pack.bookmarks and pack.size + size > self._max:
            pack = _Pack()
            packs.append(pack)
        pack.bookmarks.append(bookmark)
        pack.delivery_counts.append(delivery_count)
        pack.lease_deadlines.append(lease_deadline_ms or 0)
        pack.seqs.append(seq)
        pack.barriers.append(is_barrier)
        pack.payloads.append(payload)
        pack.size += size
        self._count += 1

    def records(self) -> list[OutRecord]:
        """One record per pack; the deliveries of one subscription in the order made."""
        return [OutRecord(topic, pack.encode(sub_id, queue, fmt))
                for (topic, sub_id, queue, fmt), packs in self._packs.items() for pack in packs]
