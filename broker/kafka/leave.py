"""Taking a dead member out of a consumer group at once.

A `kq serve` killed with -9 stays a member of PREFIX.service until its session times out, and
its restart would wait that out, then a rebalance, before any shard is served again.
librdkafka has no call that removes another member, so an instance keeps its member id in its
data_dir and, when it starts again, asks the group coordinator to let that member leave: two
small requests of the Kafka protocol (FindCoordinator and LeaveGroup, version 0) on a plain
socket. Only over PLAINTEXT: with TLS or SASL settings the old member just times out.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Mapping

log = logging.getLogger("kq.group")

FIND_COORDINATOR, LEAVE_GROUP = 10, 13
UNKNOWN_MEMBER_ID = 25


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _call(address: tuple[str, int], api: int, body: bytes, timeout: float) -> bytes:
    """One request (version 0) and its response, after the correlation id."""
    request = struct.pack(">hhi", api, 0, 1) + _string("kq-leave") + body
    with socket.create_connection(address, timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read(sock, 4))[0]
        return _read(sock, size)[4:]


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def leave_group(bootstrap: str, extra: Mapping[str, object], group: str, member_id: str,
                timeout: float = 3.0) -> bool:
    """Whether `member_id` left `group` (False, and a note in the log, if it could not)."""
    if str(extra.get("security.protocol", "plaintext")).lower() != "plaintext":
        return False
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        found = _call((host, int(port)), FIND_COORDINATOR, _string(group), timeout)
        error, _node, length = struct.unpack(">hih", found[:8])
        if error:
            raise ConnectionError(f"FindCoordinator error {error}")
        coordinator = (found[8:8 + length].decode(),
                       struct.unpack(">i", found[8 + length:12 + length])[0])
        (error,) = struct.unpack(">h", _call(coordinator, LEAVE_GROUP,
                                             _string(group) + _string(member_id), timeout)[:2])
    except (OSError, ValueError, struct.error) as exc:
        log.info("could not take the old member %s out of %s (%s): it times out instead",
                 member_id, group, exc)
        return False
    if error == UNKNOWN_MEMBER_ID:
        return False  # gone already
    if error:
        log.info("the group coordinator refused to take %s out of %s (error %d)", member_id,
                 group, error)
        return False
    return True
