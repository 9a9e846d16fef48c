"""Faults on purpose, for the crash tests of the commit order (broker.service.commit).

Setting the environment variable KQ_CRASH_AFTER_STEP=N makes the process SIGKILL itself right
after step N of the first batch that has something to journal; with KQ_CRASH_ON_KIND=KIND
(e.g. `leased`), of the first batch that journals a transition of that kind; with
`exactly_once` and KQ_CRASH_BEFORE_COMMIT=1, step 2's crash comes inside the Kafka
transaction, after the journal was flushed and before the commit. KQ_TEST_DROP_STATE_WRITE
=KIND loses the state write of the first message that gets a transition of that kind, so that
the service differs from its journal (tests of `kq journal audit`).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

from broker.state.layout import Checkpoint, message_key

log = logging.getLogger("kq.commit")

STEPS: Final = ("copies", "journal", "deliveries", "state")


class CrashPoints:
    def __init__(self, transactional: bool) -> None:
        self._transactional = transactional
        self._after = int(os.environ.get("KQ_CRASH_AFTER_STEP") or 0) or None
        self._kind = os.environ.get("KQ_CRASH_ON_KIND")
        # with exactly_once, step 2's crash comes before the transaction's commit instead
        self.before_commit = os.environ.get("KQ_CRASH_BEFORE_COMMIT") == "1"
        self._drop_kind = os.environ.get("KQ_TEST_DROP_STATE_WRITE")

    def reached(self, step: int, cp: Checkpoint, where: str = "") -> None:
        """Step `step` of `cp`'s batch is done (`where`: a point inside it, named)."""
        if self._after != step or not cp.transitions:
            return
        if step == 2 and self._transactional and self.before_commit and not where:
            return  # it came inside the transaction, or not at all
        if self._kind is None or any(t.kind.value == self._kind for t in cp.transitions):
            log.warning("KQ_CRASH_AFTER_STEP=%d: killing myself after step %s", step,
                        where or STEPS[step - 1])
            os.kill(os.getpid(), signal.SIGKILL)

    def dropped_write(self, cp: Checkpoint) -> frozenset[bytes]:
        """The state keys of `cp` to lose on purpose (none, unless asked)."""
        hit = next((t for t in cp.transitions if t.kind == self._drop_kind and t.bookmark), None)
        if hit is None or hit.bookmark is None:
            return frozenset()
        self._drop_kind = None
        log.warning("KQ_TEST_DROP_STATE_WRITE: not storing what %s did to %s", hit.kind.value,
                    hit.bookmark)
        return frozenset({message_key(hit.queue, hit.bookmark)})
