"""What the parts of the engine (timers, dispatch, acks) may use of the whole.

`Engine` inherits its parts; each part states here, once, the state and the engine methods it
relies on, so every part type-checks alone and the Engine's definitions fill them in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import trait

from broker.engine.effects import Effect
from broker.engine.queue import Message, QueueState, Subscription
from broker.engine.transitions import Reason, Transition
from broker.expr import Doc

if TYPE_CHECKING:  # (engine.acks is a part itself)
    from broker.engine.acks import Sweep


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class EnginePart:
    queues: dict[str, QueueState]
    subs: dict[str, Subscription]
    sub_ids_of: dict[str, set[str]]
    last_seen: dict[str, int]
    speakers: dict[str, tuple[str, str, bool]]
    unconfirmed: set[str]
    heartbeat_timeout_ms: int
    _out: list[Effect]
    _touched: set[str]
    _sweeps: list[Sweep]  # acks by filter under way (engine.acks)

    def _do(self, t: Transition) -> Message | None:
        raise NotImplementedError

    def _reject(self, client: str, request_id: str, message: str) -> None:
        raise NotImplementedError

    def _queue(self, name: str, client: str, request_id: str,
               principal: str | None = None) -> QueueState | None:
        raise NotImplementedError

    def doc_of(self, q: QueueState, msg: Message, now: int | None = None) -> Doc | None:
        raise NotImplementedError

    def _end_subscription(self, sub: Subscription, now: int, reason: Reason) -> None:
        raise NotImplementedError

    def _give_back(self, q: QueueState, msg: Message, now: int, reason: Reason,
                   cancel_count: int | None = None, delay_ms: int | None = None) -> None:
        raise NotImplementedError

    def _remove(self, q: QueueState, msg: Message, now: int, why: Reason,
                cancel_count: int | None = None) -> None:
        raise NotImplementedError

    def _replaced_since(self, q: QueueState, msg: Message) -> bool:
        raise NotImplementedError
