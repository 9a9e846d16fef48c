"""How a fatal producer error reaches the committer, whatever form confluent-kafka gives it."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.errors import DeliveryFailedError, FencedError
from broker.service.sending import Sender

FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
OTHER = KafkaError(KafkaError._FATAL, "idempotence broke", fatal=True)


class _Producer:
    """A producer whose flush fails the way given; `fatal`: what a transactional producer
    says when asked to abort (None: it aborts)."""

    def __init__(self, failure: BaseException, fatal: KafkaError | None = None) -> None:
        self.failure = failure
        self.fatal = fatal
        self.aborted = False

    def flush(self, timeout: float) -> int:
        raise self.failure

    def abort_transaction(self, timeout: float) -> None:
        if self.fatal is not None:
            raise KafkaException(self.fatal)
        self.aborted = True


def _bare_system_error() -> SystemError:
    return SystemError("<method 'flush'> returned NULL without setting an exception")


def _with_cause(cause: BaseException) -> SystemError:
    err = _bare_system_error()
    err.__cause__ = cause
    return err


@pytest.mark.parametrize("failure, fatal", [
    (KafkaException(FENCED), None),
    (_with_cause(KafkaException(FENCED)), None),
    (_bare_system_error(), FENCED),  # confluent-kafka lost why; the producer says it again
])
def test_a_fenced_producer_is_reported_as_fenced_in_every_form(failure, fatal):
    producer = _Producer(failure, fatal)
    sender = Sender(producer, partition=3, transactional=True)  # type: ignore[arg-type]
    with pytest.raises(FencedError, match="shard 3: Kafka fenced"):
        sender.flush(1.0)


def test_another_fatal_error_is_a_delivery_failure_that_names_it():
    producer = _Producer(_bare_system_error(), OTHER)
    sender = Sender(producer, partition=0, transactional=True)  # type: ignore[arg-type]
    with pytest.raises(DeliveryFailedError, match="idempotence broke"):
        sender.flush(1.0)


@pytest.mark.parametrize("transactional", [True, False])
def test_a_system_error_with_no_fatal_error_behind_it_is_not_hidden(transactional):
    producer = _Producer(_bare_system_error())
    sender = Sender(producer, partition=0, transactional=transactional)  # type: ignore[arg-type]
    with pytest.raises(SystemError):
        sender.flush(1.0)
    assert producer.aborted is transactional  # the transaction is over either way
