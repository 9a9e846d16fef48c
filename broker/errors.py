"""The one error tree of kq: catch `KqError` to catch everything kq raises on purpose."""


class KqError(Exception):
    """Root of every error kq raises deliberately."""


class ConfigError(KqError):
    """The configuration is invalid; the message names the queue and the key."""


class ExpressionError(KqError):
    """An expression does not parse or cannot be evaluated; the message carries the position."""


class CommandError(KqError):
    """The service refused a command (unknown queue, bad bookmark, not entitled, ...)."""


class StateError(KqError):
    """The local state disagrees with Kafka or an illegal state transition was attempted."""


class IllegalTransitionError(StateError):
    """A message was asked to move between two states the transition table does not allow."""


class KafkaUnavailableError(KqError):
    """Kafka could not be reached at the configured bootstrap address."""

    def __init__(self, address: str, detail: str = "") -> None:
        self.address = address
        message = f"Kafka is unreachable at {address}"
        super().__init__(f"{message}: {detail}" if detail else message)


class DeliveryFailedError(KqError):
    """A record the service produced was not acknowledged by Kafka."""


class FencedError(KqError):
    """This instance no longer owns a shard: another took it over (its takeover marker is in
    the shard's journal after our last record, or the group gave the shard away). The shard's
    runner stops at once, writing nothing more for it."""
