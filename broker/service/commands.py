"""Commands from PREFIX.commands, decoded into engine events (or a query)."""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from broker import wire
from broker.config import Config
from broker.engine import events as ev
from broker.packed import unpack_array
from broker.values import CLIENT_NAME, MAX_BACKLOG, MAX_PERIOD_MS, Bookmark


@dataclass(frozen=True)
class Query:
    client: str
    request_id: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Invalid:
    """A command that could not be understood; `client` is known when the record said it."""

    client: str | None
    request_id: str
    message: str


def queue_of(value: bytes | None) -> str | None:
    """The queue a command record is about (a query's too), or None (a client-wide command,
    or a record that does not decode: the shard it came to refuses it)."""
    try:
        c = wire.decode("command", value or b"")
        if c["type"] == "query":
            queue = json.loads(c["query"] or "{}").get("queue")
            return queue if isinstance(queue, str) else None
    except (ValueError, AttributeError):
        return None
    return c["queue"] or None


def shard_elsewhere(config: Config, here: Container[str], value: bytes | None) -> int | None:
    """The shard a command belongs to when its queue is not `here` (this shard's queues):
    a queue with a `shard` key, which the client placed by its name's hash before it knew
    better. None for every command of a one-shard config."""
    if config.service.shards == 1:
        return None
    queue = queue_of(value)
    if queue is None or queue in here or queue not in config.queues:
        return None
    return config.shard_of(queue)


def decode_command(value: bytes | None,
                   principal: str | None = None) -> list[ev.Event | Query | Invalid]:
    """The events a command record stands for. `principal` is who sent it as the topic it
    came on tells (the principal the record itself names is not believed)."""
    try:
        c = wire.decode("command", value or b"")
    except ValueError as exc:
        return [Invalid(None, "", str(exc))]
    client, rid, kind = c["client"], c["request_id"], c["type"]
    if not CLIENT_NAME.match(client):
        return [Invalid(None, rid, f"bad client name {client!r} in a {kind} command")]
    try:
        return _events(c, client, rid, kind, principal)
    except (ValueError, KeyError) as exc:
        return [Invalid(client, rid, f"bad {kind} command: {exc}")]


def _events(c: dict[str, Any], client: str, rid: str, kind: str,
            who: str | None) -> list[ev.Event | Query | Invalid]:
    queue = c["queue"] or ""
    if c["packed_bookmarks"]:  # (clients since schema 4 send their batched acks so)
        bookmarks = tuple(Bookmark.parse_many(c["packed_bookmarks"].split("\n")))
        counts = tuple(unpack_array("i", c["packed_counts"] or b""))
    else:
        bookmarks = tuple(Bookmark.parse(b) for b in c["bookmarks"])
        counts = tuple(c["delivery_counts"]) or (0,) * len(bookmarks)
    if len(counts) != len(bookmarks):
        return [Invalid(client, rid, f"{len(counts)} delivery counts for {len(bookmarks)} "
                                     "bookmarks")]
    match kind:
        case "subscribe":
            if c["mode"] not in (None, "", "queue", "browse"):
                return [Invalid(client, rid, f"unknown mode {c['mode']!r} (use 'queue' or "
                                             "'browse')")]
            backlog = 1 if c["max_backlog"] is None else int(c["max_backlog"])
            if backlog > MAX_BACKLOG:
                return [Invalid(client, rid, f"max_backlog must be <= {MAX_BACKLOG}, got "
                                             f"{backlog}")]
            if (c["replay_period_ms"] or 0) > MAX_PERIOD_MS:
                return [Invalid(client, rid, f"replay_period of {c['replay_period_ms']} ms is "
                                             "longer than a hundred years")]
            return [ev.Subscribed(client, c["sub_id"] or "", queue, backlog, rid,
                                  c["filter"] or None, who, browse=c["mode"] == "browse",
                                  replay_ms=c["replay_period_ms"])]
        case "unsubscribe":
            return [ev.Unsubscribed(client, c["sub_id"] or "", rid, who)]
        case "close":
            return [ev.ClientClosed(client, who)]
        case "heartbeat":
            return [ev.Heartbeat(client, who, c["instance"])]
        case "ack":
            return [ev.Acked(client, queue, bookmarks, rid, who, counts)]
        case "ack_where":
            return [ev.AckWhere(client, queue, c["filter"] or "", rid, who)]
        case "cancel":
            delay = c["delay_ms"]
            if delay is not None and not 0 <= delay <= MAX_PERIOD_MS:
                return [Invalid(client, rid, f"a cancel's delay must be >= 0 ms and at most a "
                                             f"hundred years, not {delay}")]
            return [ev.Cancelled(client, queue, b, rid, who, delay, n)
                    for b, n in zip(bookmarks, counts, strict=True)]
        case "expire":
            return [ev.ExpireRequested(client, queue, b, rid, who, n)
                    for b, n in zip(bookmarks, counts, strict=True)]
        case "extend":
            period = c["period_ms"]
            if period is None or not 0 < period <= MAX_PERIOD_MS:
                return [Invalid(client, rid, f"an extend's period must be > 0 ms and at most a "
                                             f"hundred years, not {period}")]
            return [ev.Extended(client, queue, b, n, period, rid, who)
                    for b, n in zip(bookmarks, counts, strict=True)]
        case "query":
            return [Query(client, rid, json.loads(c["query"] or "{}"))]
    return [Invalid(client, rid, f"unknown command type {kind!r}")]
