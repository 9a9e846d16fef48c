"""The kq client (SPEC section 7): `QueueClient` for threads, `AsyncQueueClient` for asyncio,
`Publisher` for producers that honour flow control. Both clients drive one sans-I/O core
(`broker.client.core`) with a Kafka transport of their own."""

from broker.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
from broker.client.core import ClientCore, LeaseLost
from broker.client.message import Message
from broker.client.sync import QueueClient, Subscription
from broker.errors import CommandError
from broker.publisher import Publisher

__all__ = ["QueueClient", "Subscription", "Message", "AsyncQueueClient", "AsyncSubscription",
           "AsyncMessage", "CommandError", "LeaseLost", "Publisher", "ClientCore"]
