"""The names of kq's own topics, under the configured prefix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Topics:
    prefix: str

    @property
    def commands(self) -> str:
        return f"{self.prefix}.commands"

    def commands_of(self, principal: str) -> str:
        """A principal's own command topic: Kafka ACLs can let only that principal write it,
        and the service takes every command on it as sent by that principal."""
        return f"{self.prefix}.commands.{principal}"

    @property
    def journal(self) -> str:
        return f"{self.prefix}.journal"

    def deliver(self, client: str) -> str:
        return f"{self.prefix}.deliver.{client}"

    @property
    def flow(self) -> str:
        """Pause and resume records of flow-controlled queues, keyed by queue name."""
        return f"{self.prefix}.flow"
