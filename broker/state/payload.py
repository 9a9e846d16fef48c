"""A source record as kq keeps it for delivery: its key, value, headers and timestamp."""

from __future__ import annotations

from broker import wire
from broker.packed import is_packed_payload, pack_payload, unpack_payload


class Payload:
    """A source record as the subscriber will see it. Stored packed (`broker.packed`): the
    same bytes go into delivery envelopes as they are."""

    __slots__ = ("key", "value", "headers", "timestamp_ms", "_packed")

    def __init__(self, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes | None]], timestamp_ms: int,
                 packed: bytes | None = None) -> None:
        self.key, self.value, self.headers, self.timestamp_ms = key, value, headers, timestamp_ms
        self._packed = packed

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Payload) and (self.key, self.value, self.headers,
                                               self.timestamp_ms) == (
            other.key, other.value, other.headers, other.timestamp_ms)

    @property
    def size(self) -> int:
        return (len(self.key or b"") + len(self.value or b"")
                + sum(len(k) + len(v or b"") for k, v in self.headers))

    def encode(self) -> bytes:
        if self._packed is None:
            self._packed = pack_payload(self.key, self.value, self.headers, self.timestamp_ms)
        return self._packed

    @classmethod
    def decode(cls, data: bytes) -> Payload:
        if is_packed_payload(data):
            return cls(*unpack_payload(data), packed=data)
        r = wire.decode("stored_payload", data)  # stored by kq before payloads were packed
        headers = [(h["key"], h["value"]) for h in r["headers"]]
        return cls(r["key"], r["value"], headers, r["timestamp_ms"])
