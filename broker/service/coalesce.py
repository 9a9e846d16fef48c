"""The state write coalesced over the batches of a short window.

Every batch is journaled, and its deliveries sent, on its own (broker.service.commit); the
state the batches leave is written to RocksDB once per window: every WINDOW_MS, or
WINDOW_TRANSITIONS transitions, or WINDOW_ARRIVALS messages queued, and whenever the service
falls idle or stops. The write holds the union of the keys the window's batches touched,
each as the window left it, so a message leased and acked inside one window costs one
delete, not a lease row and then a delete (a lease lives about a tenth of a second under
load, shorter than a window), and one queued, leased and acked inside it costs nothing
(`Checkpoint.changes`).

Two rules keep recovery exact:
- The rows are encoded from the engine right after the window's last batch was processed,
  never later: written with that batch's journal offset, a row that already held a later
  batch's transition would have it replayed twice. A window therefore closes at a batch the
  journal records (its offset is the state's place in the journal), and the write waits for
  that batch's deliveries like any batch's state write, so it lands after every earlier one's.
- Only when the state is written changes, not when deliveries go out: at most the last
  UNSENT_BATCHES journaled batches may still have unsent deliveries, as before, and recovery
  resends the leases of those only. The journal tail it replays is longer by up to one window.

Until the write lands, the payloads of the messages the window queued are read from memory.
"""

from __future__ import annotations

import os
import time
from typing import Final

from broker.engine.engine import Engine
from broker.state.layout import Checkpoint, StateChanges
from broker.state.payload import Payload
from broker.values import Bookmark

# Long enough to hold a lease under load (~0.1 s at 18,000 msgs/s with 2,000 in flight),
# short enough that a restart replays little more journal. Crash tests stretch it.
WINDOW_MS: Final = int(os.environ.get("KQ_TEST_STATE_WINDOW_MS") or 200)
WINDOW_TRANSITIONS: Final = 50_000  # bounds the memory a window holds
# Arrivals gain nothing from the window (each message's row is written once either way) and
# hold their payloads until it closes: a burst of arrivals (a deep backlog loading at ~50,000
# msgs/s) closes it after about two batches, or the service's memory keeps the burst's high
# water mark (1,000,000 queued cost 7 bytes more each with 200 ms windows of arrivals).
WINDOW_ARRIVALS: Final = 2_000


class StateWindow:
    """The batches committed since the last state write, merged."""

    def __init__(self, window_ms: int = WINDOW_MS, max_transitions: int = WINDOW_TRANSITIONS,
                 max_arrivals: int = WINDOW_ARRIVALS) -> None:
        self._window_s = window_ms / 1000
        self._max, self._max_arrivals = max_transitions, max_arrivals
        self._open = Checkpoint()
        self._opened = 0.0
        self._skip: set[bytes] = set()
        self.last: Checkpoint | None = None  # the last batch in it the journal records

    def __bool__(self) -> bool:
        return self.last is not None

    def add(self, cp: Checkpoint, skip: frozenset[bytes]) -> None:
        """A committed batch joins the window (its rows are encoded when the window closes)."""
        w = self._open
        if not (cp.transitions or cp.positions):
            return  # nothing of the state changed (replies only)
        if self.last is None:
            self._opened = time.monotonic()
        w.transitions.extend(cp.transitions)
        w.messages.update(cp.messages)
        w.payloads.update(cp.payloads)
        w.positions.update(cp.positions)
        self._skip.update(skip)
        self.last = cp

    def due(self) -> bool:
        return self.last is not None and (
            len(self._open.transitions) >= self._max
            or len(self._open.payloads) >= self._max_arrivals
            or time.monotonic() - self._opened >= self._window_s)

    def close(self, engine: Engine) -> tuple[Checkpoint, StateChanges]:
        """The window's rows, encoded now (the engine must not have moved past its last
        batch), and the window as one checkpoint; the next batch opens a new window."""
        assert self.last is not None
        w, last = self._open, self.last
        w.batch, w.writer, w.journal_offset = last.batch, last.writer, last.journal_offset
        changes = w.changes(engine, frozenset(self._skip))
        self._open, self._skip, self.last = Checkpoint(), set(), None
        return w, changes

    def payload(self, bm: Bookmark) -> Payload | None:
        return self._open.payloads.get(bm)
