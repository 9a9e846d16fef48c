"""Runs a command for as long as the process that started us lives.

`python -m broker.kafka.guard CMD ARGS...` starts CMD, then reads its own stdin, a pipe whose
other end only the starting process holds. However that process ends (SIGKILL included) the
pipe closes, the read returns, and CMD is stopped. The embedded broker runs under it so that a
killed `kq serve` does not leave a broker holding its port. (PR_SET_PDEATHSIG would be the
kernel's way, but it is not available everywhere kq runs.) SIGTERM and SIGINT are passed on
to CMD, and the guard exits with CMD's status once it has stopped.

`--remove DIR` before CMD deletes DIR once CMD has stopped: Apache Kafka's data directory,
which nobody else would clean up after a SIGKILL of the starting process.

Standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from types import FrameType

STOP_TIMEOUT_S = 10.0


def main(argv: list[str]) -> int:
    remove: str | None = None
    if argv[:1] == ["--remove"] and len(argv) > 1:
        remove, argv = argv[1], argv[2:]
    if not argv:
        print("usage: python -m broker.kafka.guard [--remove DIR] CMD [ARGS...]",
              file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def stop(signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        if child.poll() is None:
            child.send_signal(signum)
            try:
                child.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if remove:
            shutil.rmtree(remove, ignore_errors=True)
        os._exit(child.returncode if child.returncode >= 0 else 128 - child.returncode)

    def follow() -> None:  # CMD ended by itself: so do we, with its status
        child.wait()
        stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=follow, daemon=True).start()
    while sys.stdin.buffer.read(4096):  # returns empty once our starter is gone
        pass
    stop()
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
