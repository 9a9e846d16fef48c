"""What the service reads, from where, on whose behalf, and in which order.

Every queue is a reader of the partitions its regex matches, with its own position, so a queue
added later (or whose recovery point changed) can start further back than the others; the
service itself is the reader "" of its commands topic and of the topics it forwards. Each
partition is read from the lowest position of its readers, and a record counts for a reader
only at or beyond that reader's position.

Commands have their own consumer and are taken first: behind a deep backlog of source
records they would otherwise wait long enough for the leases they ack to lapse.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from broker.engine.engine import Engine
from broker.kafka import clients
from broker.kafka.gaps import GapCheck
from broker.service.routing import Router
from broker.service.topics import TopicWatch
from broker.state.layout import ReaderKey

log = logging.getLogger("kq.inputs")

SERVICE = ""  # the reader name of the service itself
UNSET = -1  # a position not read yet: start at the reader's recovery point
TOPIC_REFRESH_S = 2.0
# When nothing is waiting, the service waits on one consumer only, the sources' (a consumer
# waits in whole milliseconds), then looks at the commands' without waiting: a command that
# arrives meanwhile waits out that turn. A source record's wait would add to its message's
# latency; an ack's only frees its lease a little later. Short while records keep coming,
# longer once the service has been idle a while (an idle service should not spin); a turn
# lasts as long as when the two consumers were waited on in turn, one half each.
BUSY_WAIT_S = 0.002
IDLE_WAIT_S = 0.010
IDLE_AFTER_S = 0.5
# How long after records last came the next wait for records starts. What arrives meanwhile
# is taken in one batch: what every batch costs whatever its size (its journal part, two
# flushes, a delivery record per subscription that each worker then fetches) would otherwise
# be paid per few messages. Short, because most arrivals come batched already (a Kafka
# producer sends what it has every 5 ms by default, a worker its acks every 20 ms:
# broker.client.acks), and a record that comes during the wait waits with it: at 5 ms it
# was up to a third of the publish -> lease time at 5,000 msgs/s. A drain's batches take
# longer than this already; a quiet service does not wait.
LINGER_S = 0.001
# Longest wait at start for the commands sent while the service was down, before timers run
CATCH_UP_S = 30.0


class Inputs:
    def __init__(self, consumer: Consumer, commands: Consumer, admin: AdminClient,
                 router: Router, engine: Engine, command_topics: list[str],
                 positions: dict[ReaderKey, int], required: tuple[str, ...] = (),
                 command_partition: int = 0, reread_gaps: bool = False) -> None:
        self._consumer, self._router = consumer, router
        # (not on Apache Kafka: broker.kafka.gaps)
        self._source_gaps = GapCheck(consumer, reread_gaps)
        self._command_gaps = GapCheck(commands, reread_gaps)
        self._last_input = 0.0  # monotonic time records last came in
        self.linger_s = LINGER_S
        self._commands = commands
        self._engine = engine
        self.command_topics = command_topics  # the shared one, then one per [auth] principal
        self.command_partition = command_partition  # the shard's
        # kq's own topics, created at start: one missing later means Kafka lost its data
        self._topics = TopicWatch(admin, {*command_topics, *required}, every_s=TOPIC_REFRESH_S)
        self.positions = positions
        self._assigned: set[tuple[str, int]] = set()
        # TargetQueueDepth: readers that stopped at a record their full queue turned away
        self.blocked: set[ReaderKey] = set()
        self._paused: set[tuple[str, int]] = set()
        self._catch_up: dict[str, int] | None = None  # command topic -> its end at start
        self._catch_up_until = 0.0
        # (topic, partition) -> the offset the next source record should have, where kq
        # read up to it before: a record further on means records in between went missing
        self._expected: dict[tuple[str, int], int] = {}
        self.on_lost: Callable[[str, int, int, int], None] = lambda *_: None

    def start(self) -> None:
        p = self.command_partition
        for topic in self.command_topics:
            key = (SERVICE, topic, p)
            if self.positions.get(key, UNSET) < 0:
                # Commands sent before a fresh start are stale: begin at the current end.
                self.positions[key] = clients.end_offset(self._consumer, topic, p)
        self._commands.assign([TopicPartition(t, p, self.positions[(SERVICE, t, p)])
                               for t in self.command_topics])
        for t in self.command_topics:
            self._command_gaps.moved(t, p, self.positions[(SERVICE, t, p)])
        # Commands sent while the service was down (acks, heartbeats, cancels) are judged as
        # if they had come in time: until they are read, no lease or heartbeat may lapse.
        self._catch_up = {t: clients.end_offset(self._consumer, t, p)
                          for t in self.command_topics}
        self._catch_up_until = time.monotonic() + CATCH_UP_S
        self.refresh(force=True)

    def caught_up(self, newer: dict[ReaderKey, int]) -> bool:
        """Whether the commands that were waiting at start have all been read (with the
        positions of the batch at hand, `newer`): until then timers must not run, or an ack
        sent before its lease's deadline, while the service was down, would find the lease
        lapsed and the message leased to another subscriber."""
        if self._catch_up is None:
            return True
        p = self.command_partition
        behind = {t: end for t, end in self._catch_up.items()
                  if newer.get((SERVICE, t, p), self.positions.get((SERVICE, t, p), UNSET)) < end}
        if behind and time.monotonic() < self._catch_up_until:
            return False
        if behind:
            log.warning("commands waiting since the start not all read after %.0f s (%s): "
                        "timers run again", CATCH_UP_S, ", ".join(behind))
        self._catch_up = None
        return True

    @property
    def idle(self) -> bool:
        """No input for IDLE_AFTER_S."""
        return time.monotonic() - self._last_input > IDLE_AFTER_S

    def poll(self, max_records: int, wait: bool = True) -> list[Message]:
        """The next records: commands first, then source records; with `wait`, at least
        LINGER_S after records last came, and a little more for some when none are there."""
        if wait and (rest := self.linger_s - (time.monotonic() - self._last_input)) > 0:
            time.sleep(rest)
        commands = self._commands_taken(max_records, 0)
        sources = self._sources_taken(max_records, 0)
        if wait and not commands and not sources:
            pause = IDLE_WAIT_S if self.idle else BUSY_WAIT_S
            sources = self._sources_taken(max_records, pause)
            if not sources:
                commands = self._commands_taken(max_records, 0)
        if commands or sources:
            self._last_input = time.monotonic()
        return commands + sources

    def _commands_taken(self, max_records: int, wait_s: float) -> list[Message]:
        return self._command_gaps.passed(clients.take(self._commands, max_records, wait_s))

    def _sources_taken(self, max_records: int, wait_s: float) -> list[Message]:
        return self._source_gaps.passed(clients.take(self._consumer, max_records, wait_s))

    def lag(self) -> int:
        """Source records not read yet, as of the last fetch's watermarks."""
        try:
            parts = self._consumer.position(self._consumer.assignment())
        except Exception:  # noqa: BLE001 - closed meanwhile: nothing to report
            return 0
        total = 0
        for tp in parts:
            _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high is not None and high > tp.offset:
                total += high - tp.offset
        return total

    def arrived(self, topic: str, partition: int, offset: int) -> None:
        """A source record came: records skipped before it that the topic's retention
        deleted are reported (`on_lost`). Offsets also skip transaction markers, aborted
        records and compacted ones, so only what lies below the partition's first offset
        counts as lost."""
        key = (topic, partition)
        expected = self._expected.get(key)
        self._expected[key] = offset + 1
        if expected is None or offset <= expected:
            return
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                      cached=True)
        if low is None or low <= expected:  # maybe not known yet: ask the broker
            try:
                low, _ = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=5)
            except Exception:  # noqa: BLE001 - unknown: nothing is claimed lost
                return
        if low is not None and low > expected:
            self.on_lost(topic, partition, expected, min(int(low), offset))

    def readers(self, topic: str) -> tuple[str, ...]:
        if topic in self.command_topics:
            return (SERVICE,)
        queues = self._router.queues_of(topic)
        return (*queues, SERVICE) if self._router.forward_target(topic) else queues

    def is_new(self, reader: str, topic: str, partition: int, offset: int) -> bool:
        """Whether `reader` has not consumed this record yet (and is not stopped)."""
        if (reader, topic, partition) in self.blocked:
            return False
        return offset >= self.positions.get((reader, topic, partition), UNSET)

    def block(self, queue: str, topic: str, partition: int) -> None:
        """Stop reading this partition for a full queue; pause it when nobody else reads it."""
        self.blocked.add((queue, topic, partition))
        if all((r, topic, partition) in self.blocked for r in self.readers(topic)):
            self._consumer.pause([TopicPartition(topic, partition)])
            self._paused.add((topic, partition))

    def resume(self, queue: str) -> None:
        """The queue has room: read on from its position (records read meanwhile for the
        other readers are read again; they skip them)."""
        keys = [k for k in self.blocked if k[0] == queue]
        self.blocked.difference_update(keys)
        for _, topic, partition in keys:
            tp = TopicPartition(topic, partition, self._start_offset(topic, partition))
            if (topic, partition) in self._paused:
                self._consumer.resume([TopicPartition(topic, partition)])
                self._paused.discard((topic, partition))
            self._consumer.seek(tp)
            self._expect(topic, partition, tp.offset)

    def rewind(self, queue: str) -> dict[ReaderKey, int]:
        """Positions that send `queue` back to its recovery point in every partition."""
        return {key: UNSET for key in self.positions if key[0] == queue}

    def of_queue(self, queue: str) -> dict[tuple[str, int], int]:
        return {(t, p): o for (r, t, p), o in self.positions.items() if r == queue and o >= 0}

    def refresh(self, force: bool = False) -> None:
        """Pick up underlying topics (and partitions) that appeared since the last look: a
        listing made in the background (or, `force`, one waited for)."""
        listed = self._topics.now() if force else self._topics.latest()
        if listed is None:
            return
        topics = {t: n for t, n in listed.items() if n is not None}
        new = [(t, p) for t, n in topics.items()
               if self._router.wanted(t) and t not in self.command_topics
               for p in range(n) if (t, p) not in self._assigned]
        if new:
            log.info("reading %s", ", ".join(f"{t}/{p}" for t, p in new))
            self._assign(new)

    def _start_offset(self, topic: str, partition: int) -> int:
        """The lowest offset any reader of this partition still needs."""
        starts = []
        for reader in self.readers(topic):
            pos = self.positions.get((reader, topic, partition), UNSET)
            if pos >= 0:
                starts.append(pos)
            elif reader == SERVICE:
                starts.append(0)
            else:
                starts.append(self._offset_at(topic, partition,
                                              self._engine.queues[reader].start_ms))
        return min(starts, default=0)

    def _offset_at(self, topic: str, partition: int, start_ms: int) -> int:
        """Where to begin reading for records from `start_ms` on.

        Only a hint: records older than the start time are skipped by the engine anyway, and
        a broker that answers 0 (the embedded one does) just makes kq read more.
        """
        if start_ms <= 0:
            return 0
        try:
            (tp,) = self._consumer.offsets_for_times([TopicPartition(topic, partition, start_ms)],
                                                     timeout=5)
        except Exception:  # noqa: BLE001 - a hint: fall back to reading everything
            return 0
        if tp.offset >= 0:
            return int(tp.offset)
        return clients.end_offset(self._consumer, topic, partition)  # nothing that recent

    def _assign(self, tps: list[tuple[str, int]]) -> None:
        starts = [TopicPartition(t, p, self._start_offset(t, p)) for t, p in tps]
        self._consumer.incremental_assign(starts)
        self._assigned.update(tps)
        for tp in starts:
            self._expect(tp.topic, tp.partition, tp.offset)

    def _expect(self, topic: str, partition: int, offset: int) -> None:
        """Reading starts at `offset`: if a reader stopped there before, a first record
        further on means records went missing; if it is where a queue's recovery point
        begins, nothing before it was ever kq's to read."""
        self._source_gaps.moved(topic, partition, offset)
        read_to = [pos for r in self.readers(topic)
                   if (pos := self.positions.get((r, topic, partition), UNSET)) >= 0]
        if read_to and min(read_to) == offset:
            self._expected[(topic, partition)] = offset
        else:
            self._expected.pop((topic, partition), None)
