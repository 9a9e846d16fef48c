"""Deliveries packed into envelopes: one Kafka record carries many messages for one subscription.

A record per message costs the service a produce call and a delivery report, and the client a
fetch entry and a decode, whatever the message's size; packing a batch's deliveries to one
subscription into one `messages` envelope pays those once. A record never grows past the
largest one kq may write: a pack that would is closed and the next one started.
"""

from __future__ import annotations

from typing import Any

from broker import wire
from broker.service.commit import OutRecord
from broker.state.layout import Payload

# What an envelope adds around its deliveries, and each delivery around its payload (names,
# counts, bookmark): generous, so a pack always stays under the record size limit.
ENVELOPE_OVERHEAD = 1024
DELIVERY_OVERHEAD = 512


class Envelopes:
    """The deliveries of one batch, grouped by subscription, in the order they were made."""

    def __init__(self, max_record_bytes: int) -> None:
        self._max = max_record_bytes
        # (topic, sub_id, queue, format) -> packs, each a list of deliveries and its size
        self._packs: dict[tuple[str, str, str, str], list[tuple[list[dict[str, Any]], int]]] = {}

    def __bool__(self) -> bool:
        return bool(self._packs)

    def __len__(self) -> int:
        return sum(len(p[0]) for packs in self._packs.values() for p in packs)

    def add(self, topic: str, sub_id: str, queue: str, fmt: str, bookmark: str,
            delivery_count: int, lease_deadline_ms: int | None, is_barrier: bool, seq: int,
            payload: Payload) -> None:
        packs = self._packs.setdefault((topic, sub_id, queue, fmt), [])
        size = payload.size + DELIVERY_OVERHEAD
        if not packs or packs[-1][1] + size > self._max - ENVELOPE_OVERHEAD:
            packs.append(([], 0))
        items, used = packs[-1]
        items.append({
            "bookmark": bookmark, "delivery_count": delivery_count,
            "lease_deadline_ms": lease_deadline_ms, "is_barrier": is_barrier, "seq": seq,
            "key": payload.key, "value": payload.value,
            "headers": [{"key": k, "value": v} for k, v in payload.headers],
            "timestamp_ms": payload.timestamp_ms,
        })
        packs[-1] = (items, used + size)

    def records(self) -> list[OutRecord]:
        """One record per pack; the deliveries of one subscription in the order made."""
        out = []
        for (topic, sub_id, queue, fmt), packs in self._packs.items():
            for items, _ in packs:
                out.append(OutRecord(topic, wire.encode("envelope", {
                    "kind": "messages", "sub_id": sub_id, "queue": queue, "format": fmt,
                    "deliveries": items})))
        return out
