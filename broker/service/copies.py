"""Records the service writes for others to read, besides deliveries and replies: the copy
of a removed message on its dead-letter topic, and a queue's flow-control event."""

from __future__ import annotations

import json

from broker.engine.effects import DeadLetter, Flow
from broker.engine.transitions import Reason
from broker.service.commit import OutRecord
from broker.state.layout import Payload


def dead_letter_copy(d: DeadLetter, p: Payload) -> OutRecord:
    """The removed record as it was published, with kq-* headers saying why and from where
    (without its value when the value itself was too large to write)."""
    value = None if d.reason == Reason.TOO_LARGE.value else p.value
    headers = list(p.headers) + [
        ("kq-original-size", str(p.size).encode()),
        ("kq-reason", d.reason.encode()), ("kq-queue", d.queue.encode()),
        ("kq-bookmark", str(d.bookmark).encode()),
        ("kq-delivery-count", str(d.delivery_count).encode()),
        ("kq-cancel-count", str(d.cancel_count).encode()),
    ]
    return OutRecord(d.topic, value, p.key, headers)


def flow_event(topic: str, f: Flow) -> OutRecord:
    """A queue's flow state for publishers (SPEC 5), keyed by queue."""
    return OutRecord(topic, json.dumps({
        "queue": f.queue, "state": f.state, "depth": f.depth, "bytes": f.bytes,
        "at_ms": f.at_ms}).encode(), f.queue.encode())
