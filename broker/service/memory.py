"""Memory: given back to the system once a burst of work is over; the garbage collector's
work kept off the loop."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def _glibc(name: str) -> Callable[..., int] | None:
    """A function of the C library, or None where the library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_TRIM = _glibc("malloc_trim")
_MALLOPT = _glibc("mallopt")
_M_MMAP_THRESHOLD: Final = -3  # mallopt's parameter number (glibc's malloc.h)
LARGE: Final = 4 * 1024 * 1024


def map_large_blocks(threshold: int = LARGE) -> bool:
    """Give each C allocation of `threshold` bytes or more pages of its own, handed back to
    the system when it is freed; return whether it was done.

    glibc does so from 128 KiB, but raises that threshold to the size of each such block
    freed (up to 32 MiB), so that after a while the largest buffers are carved from the heaps
    instead, where what is freed stays resident. Fixed, it holds. It was 128 KiB (with
    1,000,000 messages queued, resident memory went from about 71 to 54 bytes per queued
    message), which gave pages of their own to the blocks a busy service allocates and frees
    all the time (RocksDB's write batches and memtable blocks, librdkafka's fetch and produce
    buffers, journal parts): each new page a fault, each free an munmap, about a tenth of
    `kq serve`'s CPU in a drain. At 4 MiB those come from the heaps, which the idle service
    trims (`release_free_memory`), and the memory at 1,000,000 queued stayed where it was
    (28.9 bytes per message). An operator's `MALLOC_MMAP_THRESHOLD_` in the environment stands.
    """
    if _MALLOPT is None or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    return bool(_MALLOPT(_M_MMAP_THRESHOLD, threshold))


class HoldsMemory(Protocol):
    def shed_memory(self) -> bool: ...


def release_free_memory() -> None:
    """Return the C heap's free pages to the system (glibc `malloc_trim`; a few milliseconds
    with a large heap).

    A burst (a deep queue loaded, a backlog drained) leaves freed memory in the allocator's
    arenas: librdkafka's fetch buffers, Python objects of finished batches. glibc keeps it,
    and it counts in the process's RSS until something else reuses it."""
    if _TRIM is not None:
        _TRIM(0)


# When an idle service trims the C heap, in seconds since it fell idle. Threads of RocksDB
# (its compactions) and of librdkafka go on freeing what a burst gave them for a few
# seconds after it: with 1,000,000 messages just queued, a trim at the first idle turn
# alone left 14-24 bytes per queued message resident that a trim 2 s later handed back.
TRIM_AFTER_S: Final = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


class IdleRelease:
    """What a service hands back when it falls idle: the C heap's free pages, at the first
    idle turn and a few times more while it stays idle (TRIM_AFTER_S: a few ms each with a
    large heap, so not at every turn), and, until every holder (a shard's state and pager)
    has done it, what they hold only to make writes cheaper. A holder may put its part off
    (a memtable written out less than 10 s ago); asking it again is cheap, so an idle
    service asks at each idle turn."""

    def __init__(self, holders: Callable[[], Iterable[HoldsMemory]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._holders = holders  # asked each time: a shard's store and pager open at its start
        self._clock = clock
        self._shed = False
        self._idle_since: float | None = None
        self._trims = 0  # this idle period's

    def busy(self) -> None:
        """Input arrived: the next idle period releases again."""
        self._shed = False
        self._idle_since = None
        self._trims = 0

    def idle(self) -> None:
        now = self._clock()
        if self._idle_since is None:
            self._idle_since = now
        if not self._shed:
            self._shed = all([h.shed_memory() for h in self._holders()])  # (a list: ask all)
        if self._trims < len(TRIM_AFTER_S) and now - self._idle_since >= TRIM_AFTER_S[self._trims]:
            release_free_memory()
            self._trims += 1


# Allocations between two collections of the young objects (Python's default is 700): each
# batch makes and drops tens of thousands of objects, and a collection of the older ones
# (rarer, every 10 x 100 of these) walks every message in memory. Under load what a young
# collection finds alive (leases out, the state window's transitions, messages paged back in)
# is walked again by the next older one. At 100,000 rather than 20,000 the collector takes
# half the time in a drain, with fewer, longer pauses that did not raise the latency's tail.
GC_YOUNG = 100_000


def calm_collector() -> None:
    """Once a shard is ready: what its start built lives on, so the collector need not scan
    it again (frozen), and young objects are collected less often. The loop's pauses for
    collections were its p99 latency.

    Garbage is collected first: a frozen object is never collected, and a shard stopped
    earlier in this process (moved to another instance) may still wait for its collection.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 10, 100)


def thaw_collector() -> None:
    """A shard stopped: what `calm_collector` froze is collectable again, or a process that
    runs shards one after another (shards moving between instances) would keep every
    stopped shard's state (its engine, its Kafka clients and their threads) for good. The
    shards still running are frozen again at the next one's start."""
    gc.unfreeze()


_paused = 0  # restores under way in this process (shards restore on threads of their own)
_pausing = threading.Lock()


def collector_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """No collections while `fn` runs: a restore builds a million long-lived objects, none
    of them garbage, and each collection of the older generations walks every one built so
    far (with 1,000,000 queued the collector took a third of a restart). What is left to
    collect goes at the shard's start (calm_collector)."""
    @functools.wraps(fn)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        global _paused
        with _pausing:
            _paused += 1
            gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            with _pausing:
                _paused -= 1
                if _paused == 0:
                    gc.enable()
    return paused
