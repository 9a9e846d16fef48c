"""What a caller passes the client, checked and put as the commands carry it: said at the
call, with a CommandError naming the argument, rather than refused by the service later
(a cancel is sent without waiting for an answer)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from broker.errors import CommandError
from broker.values import MAX_BACKLOG, MAX_PERIOD_MS, Duration


def subscribe_command(queue: str, filter: str | None, max_backlog: int | None, mode: str,
                      replay_period: str | None) -> dict[str, Any]:
    """The fields of a subscribe command for these arguments of `subscribe` (kept: sent
    again if the service drops the subscription); CommandError on a bad one."""
    if mode not in ("queue", "browse"):
        raise CommandError(f"unknown mode {mode!r}: use 'queue' or 'browse'")
    replay_ms = None
    if replay_period is not None:
        if mode != "browse":
            raise CommandError("replay_period applies to mode='browse' only")
        replay_ms = duration_ms(replay_period, "replay_period")
    if max_backlog is not None and (isinstance(max_backlog, bool)
                                    or not isinstance(max_backlog, int)):
        raise CommandError(f"max_backlog must be an integer >= 0, got {max_backlog!r}")
    if max_backlog is not None and max_backlog > MAX_BACKLOG:
        raise CommandError(f"max_backlog must be <= {MAX_BACKLOG}, got {max_backlog}")
    if not isinstance(queue, str) or not (filter is None or isinstance(filter, str)):
        raise CommandError(f"queue and filter are text: got {queue!r} and {filter!r}")
    return {"queue": queue, "filter": filter, "max_backlog": max_backlog, "mode": mode,
            "replay_period_ms": replay_ms}


def bookmark_list(bookmarks: Iterable[Any]) -> list[str]:
    """Bookmarks to ack as texts; one given alone, as a str, is one bookmark (not a
    sequence of one-letter ones)."""
    if isinstance(bookmarks, str):
        return [bookmarks]
    return [str(b) for b in bookmarks]


def duration_ms(value: str | float, what: str, positive: bool = False) -> int:
    """A duration given as text ("30s") or seconds (30.0), in ms; CommandError if bad, or
    below zero (at zero too, when it must be `positive`): said here, where the caller can
    be told, rather than refused by the service after a cancel was sent without waiting."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise CommandError(f"bad {what}: {value!r} seconds")
        ms = int(value * 1000)
    else:
        try:
            ms = Duration.parse(str(value)).ms
        except ValueError as exc:
            raise CommandError(f"bad {what}: {exc}") from None
    if ms > MAX_PERIOD_MS:
        raise CommandError(f"bad {what}: {value!r} (at most a hundred years)")
    if ms < 0 or (positive and ms == 0):
        least = "more than 0" if positive else "0 or more"
        raise CommandError(f"bad {what}: {value!r} (it must be {least})")
    return ms


def seconds(value: str | float | None, what: str, positive: bool = False) -> float | None:
    """A wait given as seconds (5.0) or text ("5s"), in seconds; None stays None (no
    limit). CommandError if bad, as `duration_ms`."""
    return None if value is None else duration_ms(value, what, positive) / 1000


def waits(request_timeout: str | float, heartbeat_interval: str | float) -> tuple[float, float]:
    """A client's two waits, in seconds, each more than none (a heartbeat interval of 0
    would send heartbeats without pause)."""
    return (duration_ms(request_timeout, "request_timeout", positive=True) / 1000,
            duration_ms(heartbeat_interval, "heartbeat_interval", positive=True) / 1000)
