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
- After writing its journal records, it checks that nothing came between its previous
  record and them. If something did, its records lie after a takeover marker, where every
  reader ignores them (`BatchAssembler.counts`), and it stops before anything else of the
  batch goes out: no delivery, no state.
- Before each commit it also asks whether the group still gives it the shard.

Under Apache Kafka, `exactly_once` adds the broker's own fencing (one transactional id per
shard).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer

from broker import wire
from broker.errors import FencedError
from broker.kafka.clients import end_offset
from broker.kafka.ranges import records

log = logging.getLogger("kq.fence")


class Fence:
    def __init__(self, reader: Callable[[], Consumer], topic: str, partition: int,
                 quiet_s: float, still_owner: Callable[[], bool] = lambda: True) -> None:
        self._reader = reader  # a consumer of its own: checks reassign it
        self._topic, self._partition = topic, partition
        self._quiet_s = quiet_s
        self._still_owner = still_owner
        self._confirmed = time.monotonic()  # when our last journal write was proven ours
        self.writer: str | None = None  # our marker's nonce

    def _stop(self, why: str) -> None:
        raise FencedError(f"shard {self._partition}: {why}; this instance writes nothing more "
                          "for it")

    def before_commit(self, last_offset: int) -> None:
        if not self._still_owner():
            self._stop("the group gave it to another instance")
        if time.monotonic() - self._confirmed < self._quiet_s:
            return
        end = end_offset(self._reader(), self._topic, self._partition)
        if end > last_offset + 1:
            self._check(last_offset + 1, end)
        self._confirmed = time.monotonic()

    def after_journal(self, last_offset: int, first_offset: int) -> None:
        if first_offset > last_offset + 1:
            self._check(last_offset + 1, first_offset)
        self._confirmed = time.monotonic()

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
