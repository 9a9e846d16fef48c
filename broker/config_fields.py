"""The building blocks of the configuration models: strict models whose field docstrings
document them, and the field types kq reads from text (durations, retentions, times)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from broker.values import Duration


def parse_time(text: str) -> int:
    """An ISO-8601 time as epoch milliseconds (UTC when it names no zone)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def duration(value: Any) -> Duration:
    if isinstance(value, Duration):
        return value
    return Duration.parse(value)


DurationField = Annotated[Duration, BeforeValidator(duration)]


def retention(value: Any) -> Duration | None:
    if value is None or value == "forever":
        return None
    return duration(value)


# a duration, or "forever" (None)
RetentionField = Annotated[Duration | None, BeforeValidator(retention)]

class Strict(BaseModel):
    # the docstring under each field is its description in the configuration reference
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def check_bootstrap(text: str) -> str:
    """Bootstrap servers as librdkafka takes them: host[:port],... (a listener name such as
    PLAINTEXT:// in front allowed); ValueError naming the part that is not."""
    if not text.strip():
        raise ValueError("bootstrap servers are empty: give host:port,...")
    for part in text.split(","):
        address = part.strip().rpartition("://")[2]
        host, colon, port = address.rpartition(":")
        if not colon or "]" in port:  # no port ([::1] alone: its colons are the address's)
            host, colon, port = address, "", ""
        if not host or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"bad bootstrap server {part.strip()!r} in {text!r}: use "
                             "host:port (port 1-65535), comma-separated")
    return text
