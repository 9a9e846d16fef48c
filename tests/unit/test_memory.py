"""The service shares a few C heaps among its threads (broker.service.memory): each glibc
arena keeps what its thread freed, which made a third of the resident memory of a deep
queue. Run in fresh interpreters: the limit holds only for threads started after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")

# 8 threads, alive together, allocate outside Python's small-object allocator (over 512
# bytes: malloc), then glibc's malloc_info names the heaps ("<heap nr=...>") there are.
PROBE = """
import ctypes, json, sys, tempfile, threading
from broker.service.memory import limit_malloc_arenas
done = limit_malloc_arenas() if sys.argv[1] == "limit" else None
kept, together = [], threading.Barrier(8)
def work():  # all alive at once: an exited thread's heap is handed to the next one
    kept.append([bytes(4096) for _ in range(100)])
    together.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile() as f:
    out = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(out))
    libc.fclose(ctypes.c_void_p(out))
    heaps = open(f.name).read().count("<heap nr=")
print(json.dumps({"done": done, "heaps": heaps}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, env=environ)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_threads_share_two_heaps_once_limited() -> None:
    assert _probe("limit") == {"done": True, "heaps": 2}


def test_without_the_limit_each_thread_gets_a_heap_of_its_own() -> None:
    # what the limit is for: on any machine with a core, 8 threads make more than 2 heaps
    assert _probe("none")["heaps"] > 2


def test_an_operators_malloc_arena_max_stands() -> None:
    assert _probe("limit", MALLOC_ARENA_MAX="4") == {"done": False, "heaps": 4}
