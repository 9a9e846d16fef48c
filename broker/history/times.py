"""`--since` / `--until`: an ISO-8601 time, a time relative to now (`-15m`, `-2h`, `-1d`), or
epoch milliseconds."""

from __future__ import annotations

from broker.config import parse_time
from broker.values import Duration


def moment_ms(text: str | None, now_ms: int) -> int | None:
    """Epoch milliseconds, or None when not given; raise ValueError saying what is accepted."""
    if text is None or text == "":
        return None
    if text.isdigit():  # epoch milliseconds, as scripts (and Spark options) pass them
        return int(text)
    if text.startswith("-"):
        try:
            return now_ms - Duration.parse(text[1:]).ms
        except ValueError:
            pass
    else:
        try:
            return parse_time(text)
        except ValueError:
            pass
    raise ValueError(f"bad time {text!r}: use an ISO-8601 time (2026-11-22T08:00:00Z, UTC "
                     "when no zone is given), one relative to now (-15m, -2h, -1d) or epoch "
                     "milliseconds")
