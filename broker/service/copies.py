"""Records the service writes for others to read, besides deliveries: the copy of a removed
message on its dead-letter topic, a queue's flow-control event, and replies to clients."""

from __future__ import annotations

import json
import logging
from typing import Any

from broker import wire
from broker.engine.effects import DeadLetter, Flow
from broker.engine.engine import Engine
from broker.engine.transitions import Reason
from broker.formats import load_schema
from broker.service.commit import OutRecord
from broker.state.payload import Payload
from broker.values import NOTICE

log = logging.getLogger("kq.service")


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


def reply_record(engine: Engine, shard: int, topic: str, client: str, request_id: str,
                 body: dict[str, Any] | None, error: str | None) -> OutRecord:
    """A reply (or, with `error`, a refusal) to a client's request, on its delivery topic."""
    q = engine.queues.get(body.get("queue", "")) if body and "sub_id" in body else None
    if body is not None and (q is not None or request_id == NOTICE):
        body = {**body, "shard": shard}  # where the client's commands go from now
        if q is None:  # a notice: news of the client's subscriptions on this shard
            log.info("told client %s: %s", client, body)
    if q is not None and q.config.schema_:  # a subscriber decodes msg.data with it
        body = {**(body or {}), "schema": load_schema(q.config.schema_)}
    return OutRecord(topic, wire.encode("envelope", {
        "kind": "error" if error else "reply", "request_id": request_id,
        "body": json.dumps(body) if body is not None else None, "error": error,
    }))
