"""Producing records and counting the broker's acknowledgements, for the commit order
(`broker.service.commit`): a batch's records go out without waiting, and the committer asks
later whether all of them were acknowledged."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker.errors import DeliveryFailedError, FencedError

# A transactional producer refused because a newer one with its id started: a new owner of
# the shard (librdkafka's local code, then the brokers' two)
FENCED: Final = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
FLUSH_TIMEOUT_S: Final = 15.0
ABORT_PROBE_S: Final = 5.0

Headers = list[tuple[str, bytes | None]]


@dataclass
class OutRecord:
    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None
    partition: int = -1  # -1: the producer's partitioner decides


class Acks:
    """The broker's answers for records produced together: how many are still due, the
    offsets they got (in produce order), the errors."""

    def __init__(self, count: int, since: float = 0.0) -> None:
        self.left = count
        self.since = since  # when they were produced (the sender's clock)
        self.offsets = [-1] * count
        self.errors: list[str] = []
        self.fenced: list[KafkaError] = []

    @property
    def done(self) -> bool:
        return self.left <= 0

    def callback(self, i: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            self.left -= 1
            if err is not None:
                self.errors.append(f"{msg.topic()}: {err.str()}")
                if err.code() in FENCED:
                    self.fenced.append(err)
            else:
                self.offsets[i] = msg.offset() or 0
        return on_delivery

    def refused(self, why: str) -> None:
        """Refused by the producer itself: no answer will come for it."""
        self.left -= 1
        self.errors.append(why)


class Sender:
    """The shard's producer, for the committer."""

    def __init__(self, producer: Producer, partition: int, transactional: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._producer = producer
        self._clock = clock
        self._partition = partition  # the shard, for the fenced error's message
        self._transactional = transactional

    def produce(self, records: Iterable[OutRecord], count: int) -> Acks:
        """Hand `records` (`count` of them) to the producer; their acknowledgements come
        with the producer's next poll or flush."""
        acks = Acks(count, self._clock())
        for i, r in enumerate(records):
            self._produce(r, acks, i)
        return acks

    def poll(self, timeout: float) -> None:
        """Serve the acknowledgements that came (waiting up to `timeout` for one)."""
        self._fatal_as_error(lambda: self._producer.poll(timeout))

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> int:
        """Send everything now and wait for its acknowledgements; how many did not come."""
        return int(self._fatal_as_error(lambda: self._producer.flush(timeout)))

    def raise_if_fenced(self, err: KafkaError | None) -> None:
        """The broker refused us because a newer producer of this shard started: the shard
        has a new owner, whose takeover the broker itself fences (nothing of ours lands
        after its start)."""
        if err is not None and err.code() in FENCED:
            raise FencedError(f"shard {self._partition}: Kafka fenced this instance's "
                              f"producer ({err.str()}): another instance took the shard "
                              "over; this one writes nothing more for it")

    def check(self, acks: Acks, what: str) -> None:
        """Raise for a fenced producer or any error of `acks`."""
        if acks.fenced:
            self.raise_if_fenced(acks.fenced[0])
        if acks.errors:
            raise DeliveryFailedError(f"producing {what} failed: {'; '.join(acks.errors[:5])}")

    def check_answered(self, acks: Acks, what: str) -> None:
        """Raise if `acks` have gone FLUSH_TIMEOUT_S without all their answers (as `wait`
        would): librdkafka itself gives up on a record only after its `message.timeout.ms`,
        5 minutes by default."""
        if not acks.done and self._clock() - acks.since > FLUSH_TIMEOUT_S:
            raise DeliveryFailedError(f"producing {what} failed: {acks.left} of "
                                      f"{len(acks.offsets)} not acknowledged within "
                                      f"{FLUSH_TIMEOUT_S:.0f} s")

    def wait(self, done: Callable[[], bool], what: str,
             settle: Callable[[], None] = lambda: None) -> None:
        """Poll the producer, calling `settle` after each poll, until `done()`."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        settle()
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeliveryFailedError(f"producing {what} failed: not acknowledged within "
                                          f"{FLUSH_TIMEOUT_S:.0f} s")
            self.poll(min(left, 0.1))
            settle()

    def _fatal_as_error(self, call: Callable[[], Any]) -> Any:
        """A fatal producer error (a fenced transactional producer) surfaces as a
        KafkaException, as the cause of a SystemError when confluent-kafka then calls a
        delivery callback with it still pending, or as a bare SystemError whose cause was
        lost (`_fatal_behind` asks the producer again)."""
        try:
            return call()
        except (KafkaException, SystemError) as exc:
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__
            if not isinstance(cause, KafkaException):
                cause = self._fatal_behind()
            if cause is None:
                raise
            self.raise_if_fenced(cause.args[0])
            raise DeliveryFailedError(f"producing failed: {cause}") from None

    def _fatal_behind(self) -> KafkaException | None:
        """What a bare SystemError hid: confluent-kafka raises a fatal error from inside
        librdkafka's callbacks, and a Python callback served after it can lose it, leaving a
        flush that failed and names nothing. A transactional producer says it again when
        asked to abort, which is what follows any failure inside a transaction anyway."""
        if not self._transactional:
            return None
        try:
            self._producer.abort_transaction(ABORT_PROBE_S)
        except KafkaException as exc:
            return exc if exc.args[0].fatal() else None
        return None

    def _produce(self, r: OutRecord, acks: Acks, i: int) -> None:
        while True:
            try:
                self._producer.produce(r.topic, r.value, r.key,
                                       headers=r.headers,  # type: ignore[arg-type]
                                       partition=r.partition, on_delivery=acks.callback(i))
                return
            except BufferError:  # local queue full: let it drain
                self.poll(0.05)
            except KafkaException as exc:  # refused locally (too large, bad topic name)
                self.raise_if_fenced(exc.args[0])
                acks.refused(f"{r.topic}: {exc.args[0].str()}")
                return
