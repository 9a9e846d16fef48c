"""Fencing without broker transactions: an owner never writes for a shard it lost.

Ownership moves by Kafka's group protocol, but a process frozen past its session timeout (a
long GC pause, SIGSTOP) does not know it lost its shards until it talks to the group again,
and may write meanwhile. The shard's journal partition settles it, because it has one order:
every owner writes a start-up marker before anything else, so a new owner's marker lies
between the old owner's last record and anything it writes later.

- Before a commit, after a quiet spell longer than half the session timeout (a frozen
  process is one that was quiet longer than that), the owner looks at the journal past its
  last record: another's start-up marker means someone else took over. So it stops before
  writing anything.
- A process woken from a freeze (its shard loop, which turns every few milliseconds, was
  not run for half the session timeout, or one turn took that long) may learn of its
  eviction from the group only seconds later, while the new owner is still restoring; so
  for three session timeouts after such a gap it looks before every commit, the commit of
  the turn it was frozen in included.
- After writing its journal records, it checks that nothing came between its previous
  record and them. If something did, its records lie after a takeover marker, where every
  reader ignores them (`BatchAssembler.counts`), and it stops before anything else of the
  batch goes out: no delivery, no state.
- Before each commit it also asks whether the group still gives it the shard. A process
  woken from a freeze first waits two heartbeat intervals of the group before its next
  commit: an evicted member hears so at its first heartbeat after waking, and the instance
  then takes the shard away (the look at the journal alone misses a new owner whose marker
  lands a moment after the look).

That leaves the few milliseconds between a look and the write that follows, and a process
frozen there wakes inside them: the batches it writes (the journals on their way at once,
two at most: broker.service.commit) lie after the new owner's marker, inert, and the check
after the first of them stops it. With `exactly_once` the broker closes the gap: each
shard's producer has the transactional id PREFIX.shard.K, and a new owner's producer start
makes the broker refuse every later write of the old one (`Sender.raise_if_fenced` in
broker.service.sending; the embedded broker does this too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer

from broker import wire
from broker.errors import FencedError
from broker.kafka.clients import end_offset, group_heartbeat_ms
from broker.kafka.ranges import records

log = logging.getLogger("kq.fence")


class Fence:
    def __init__(self, reader: Callable[[], Consumer], topic: str, partition: int,
                 session_s: float, still_owner: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._reader = reader  # a consumer of its own: checks reassign it
        self._topic, self._partition = topic, partition
        self._quiet_s = session_s / 2  # quiet longer than this: maybe frozen, maybe evicted
        self._watch_s = session_s * 3  # how long after that to look before every commit
        self._still_owner = still_owner
        # two of the group's heartbeat intervals: the time a woken member takes to hear it
        # was evicted
        self._settle_s = 2 * group_heartbeat_ms(int(session_s * 1000)) / 1000
        self._settle_until = 0.0
        self._clock, self._sleep = clock, sleep
        self._confirmed = clock()  # when our last journal write was proven ours
        self._last_alive: float | None = None  # the loop's last turn (none before the first)
        self._noticed: float | None = None  # the turn after which a freeze was last seen
        self._watch_until = 0.0  # until when to look before every commit
        self.writer: str | None = None  # our marker's nonce

    def _stop(self, why: str) -> None:
        raise FencedError(f"shard {self._partition}: {why}; this instance writes nothing more "
                          "for it")

    def alive(self) -> float:
        """Called on every turn of the shard's loop; the seconds since the last turn (a long
        gap means the process was frozen)."""
        now = self._clock()
        gap = 0.0 if self._last_alive is None else now - self._last_alive
        if gap > self._quiet_s and self._noticed != self._last_alive:
            self._frozen(gap, now)
        self._last_alive = now
        return gap

    def _frozen_in_turn(self) -> None:
        """A freeze inside a turn of the loop, seen at the commit it delayed. The next turn
        would see it too late: frozen while waiting for the batch before's journal, the
        process wakes to that journal's acknowledgement, which proves its last write its own
        a moment ago, and the commit would go out without a look."""
        now = self._clock()
        if (self._last_alive is not None and self._noticed != self._last_alive
                and now - self._last_alive > self._quiet_s):
            self._frozen(now - self._last_alive, now)

    def _frozen(self, gap: float, now: float) -> None:
        log.warning("shard %d: its loop did not turn for %.1f s (the process frozen, or a "
                    "call to Kafka that slow); it checks the journal for a new owner before "
                    "each commit for %.0f s", self._partition, gap, self._watch_s)
        self._watch_until = now + self._watch_s
        self._settle_until = now + self._settle_s
        self._noticed = self._last_alive  # this gap, once

    def before_marker(self) -> None:
        """A restore can take seconds, and the group may give the shard away meanwhile (this
        process's session expired): a takeover marker written then would land after the new
        owner's and stop it (every reader would take this process for the owner)."""
        if not self._still_owner():
            self._stop("the group gave it to another instance before its takeover marker "
                       "was written")

    def before_commit(self, last_offset: int) -> None:
        self._frozen_in_turn()
        wait = self._settle_until - self._clock()
        if wait > 0:  # woken from a freeze: let the group tell this process first
            self._sleep(wait)
        if not self._still_owner():
            self._stop("the group gave it to another instance")
        now = self._clock()
        if now - self._confirmed < self._quiet_s and now >= self._watch_until:
            return
        end = end_offset(self._reader(), self._topic, self._partition)
        if end > last_offset + 1:
            self._check(last_offset + 1, end)
        self._confirmed = self._clock()

    def after_journal(self, last_offset: int, first_offset: int) -> None:
        if first_offset > last_offset + 1:
            self._check(last_offset + 1, first_offset)
        self._confirmed = self._clock()

    def _check(self, start: int, end: int) -> None:
        """Journal records between our last and `end` (gaps may be transaction markers): a
        start-up marker means another owner. (Parts another writer wrote there without a
        marker are a fenced owner's, which every reader ignores.)"""
        for rec in records(self._reader(), self._topic, self._partition, start, end):
            try:
                part = wire.decode("journal", rec.value())
            except ValueError:
                continue
            if part["marker"] is not None and part["marker"] != self.writer:
                log.warning("shard %d: journal offset %d is another owner's takeover marker",
                            self._partition, rec.offset())
                self._stop(f"another instance took it over (journal offset {rec.offset()})")
