"""Small value types: durations and bookmarks, parsed once and passed around typed."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Final

# Client names become topic names (PREFIX.deliver.NAME): the characters Kafka allows.
CLIENT_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
# The request id of a reply to no request: news the service sends a client on its own (a
# subscription it dropped); clients that do not know notices ignore it as a reply nobody awaits.
NOTICE: Final = ""



def now_ms() -> int:
    """The wall clock in milliseconds, as the engine and the journal count time."""
    return int(time.time() * 1000)


_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True, order=True)
class Duration:
    """A length of time, held in whole milliseconds."""

    ms: int

    @classmethod
    def parse(cls, text: str) -> Duration:
        """Parse `500ms`, `30s`, `5m`, `1h`, `1d`; raise ValueError naming the accepted forms."""
        match = _DURATION.match(text) if isinstance(text, str) else None
        if not match:
            raise ValueError(
                f"bad duration {text!r}: use a number and a unit, e.g. 500ms, 30s, 5m, 1h, 1d"
            )
        return cls(int(float(match.group(1)) * _UNIT_MS[match.group(2)]))

    @property
    def seconds(self) -> float:
        return self.ms / 1000.0

    def __str__(self) -> str:
        for unit in ("d", "h", "m", "s"):
            size = _UNIT_MS[unit]
            if self.ms and self.ms % size == 0:
                return f"{self.ms // size}{unit}"
        return f"{self.ms}ms"


class Bookmark:
    """A message's identity in the log: TOPIC/PARTITION/OFFSET. Immutable, ordered like the
    tuple (topic, partition, offset).

    Written out rather than a frozen dataclass: the service hashes and prints each message's
    bookmark a dozen times on its way (dict keys, state keys, journal columns, envelopes),
    so the hash is computed once and the text once, on first use."""

    __slots__ = ("topic", "partition", "offset", "_hash", "_text")
    __match_args__ = ("topic", "partition", "offset")

    topic: str
    partition: int
    offset: int

    def __init__(self, topic: str, partition: int, offset: int,
                 _text: str | None = None) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self._hash = hash((topic, partition, offset))
        self._text = _text

    @classmethod
    def parse(cls, text: str) -> Bookmark:
        """Parse `ORDERS/0/1234`; the topic itself may contain `/`."""
        topic, sep, rest = text.rpartition("/")
        topic, sep2, partition = topic.rpartition("/")
        if not (sep and sep2 and topic and partition.isdigit() and rest.isdigit()):
            raise ValueError(f"bad bookmark {text!r}: expected TOPIC/PARTITION/OFFSET")
        return Bookmark(topic, int(partition), int(rest), text)  # (compiled: cls() is slow)

    @staticmethod
    def parse_many(texts: list[str]) -> list[Bookmark]:
        """Parse each, as `parse` does; an ack command's are mostly of one topic and
        partition, so those are parsed once per run of them and only the offset each time."""
        out: list[Bookmark] = []
        prefix, topic, partition = "", "", 0
        for text in texts:
            if prefix and text.startswith(prefix):
                offset = text[len(prefix):]
                if offset.isdigit():
                    out.append(Bookmark(topic, partition, int(offset), text))
                    continue
            bm = Bookmark.parse(text)
            out.append(bm)
            prefix, topic, partition = text[:text.rindex("/") + 1], bm.topic, bm.partition
        return out

    def _key(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bookmark):
            return NotImplemented
        return (self._hash == other._hash and self.offset == other.offset
                and self.partition == other.partition and self.topic == other.topic)

    def __lt__(self, other: Bookmark) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Bookmark) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Bookmark) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Bookmark) -> bool:
        return self._key() >= other._key()

    def __repr__(self) -> str:
        return f"Bookmark(topic={self.topic!r}, partition={self.partition!r}, " \
               f"offset={self.offset!r})"

    def __str__(self) -> str:
        text = self._text
        if text is None:
            text = self._text = f"{self.topic}/{self.partition}/{self.offset}"
        return text


# What a command may ask, bounded by what kq stores: a backlog is an int32 of the journal, and a
# deadline (now plus a period or delay) an int64 of milliseconds. Past these a command is
# refused, not carried into the service, where packing it would fail.
MAX_BACKLOG: Final = 2**31 - 1
MAX_PERIOD_MS: Final = 100 * 365 * 86_400_000  # a hundred years
