"""Large C allocations get pages of their own, handed back when freed
(broker.service.memory.map_large_blocks): glibc's moving threshold let librdkafka's and
RocksDB's big buffers stay resident after use, a quarter of a deep queue's memory. Run in
fresh interpreters: the setting is the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")

# One 8 MiB block is freed (glibc would raise its threshold above it), then 8 blocks of
# 4 MiB are made: how many MiB of them have pages of their own (glibc's mallinfo2)?
# (Over 512 bytes Python allocates with malloc.)
PROBE = """
import ctypes, json, sys
from broker.service.memory import map_large_blocks
done = map_large_blocks() if sys.argv[1] == "map" else None
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
first = bytes(8 << 20)
del first
before = libc.mallinfo2().hblkhd
big = [bytes(4 << 20) for _ in range(8)]
print(json.dumps({"done": done, "mapped_mib": (libc.mallinfo2().hblkhd - before) >> 20}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, env=environ)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_large_blocks_have_pages_of_their_own_handed_back_when_freed() -> None:
    assert _probe("map") == {"done": True, "mapped_mib": 32}


def test_without_it_they_come_from_the_heaps_once_a_larger_one_was_freed() -> None:
    # what it is for: glibc's own moving threshold puts them where freeing keeps them
    assert _probe("none")["mapped_mib"] == 0


def test_an_operators_malloc_mmap_threshold_stands() -> None:
    # theirs is 16 MiB: blocks of 4 MiB come from the heaps
    assert _probe("map", MALLOC_MMAP_THRESHOLD_=str(16 << 20)) == {"done": False,
                                                                  "mapped_mib": 0}


class _Holder:
    """A store whose memtable write-out is put off `put_off` times (its 10 s spacing)."""

    def __init__(self, put_off: int) -> None:
        self.put_off, self.asked = put_off, 0

    def shed_memory(self) -> bool:
        self.asked += 1
        self.put_off -= 1
        return self.put_off < 0


def test_an_idle_service_trims_the_heap_a_few_times_and_asks_a_holder_that_put_off_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.service import memory
    trims: list[float] = []
    clock = [100.0]
    monkeypatch.setattr(memory, "_TRIM", lambda _: trims.append(clock[0] - 100.0))
    late, done = _Holder(put_off=2), _Holder(put_off=0)
    release = memory.IdleRelease(lambda: [late, done], clock=lambda: clock[0])

    def idle_for(seconds: float) -> None:
        end = clock[0] + seconds
        while clock[0] < end:
            release.idle()
            clock[0] += 0.25

    idle_for(0.5)
    # The heap trimmed at the first idle turn (a few ms each with a large heap), not at every
    # turn; both holders asked at each turn
    assert trims == [0.0]
    assert late.asked == 2 and done.asked == 2
    # ... and again as the service stays idle: what RocksDB's and librdkafka's threads free
    # in the seconds after a burst goes back too; then no more, however long it stays idle
    idle_for(60)
    assert trims == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert late.asked == 3 and done.asked == 3  # until the one that put off was done
    release.busy()  # input came: the next idle period releases again
    clock[0] = 200.0
    release.idle()
    assert len(trims) == 9 and late.asked == 4
