"""kq: message-queue semantics on Kafka."""

__version__ = "0.1.0"
