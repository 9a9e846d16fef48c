"""kq: message-queue semantics on Kafka (the distribution kafka-queues)."""

__version__ = "0.4.0"
