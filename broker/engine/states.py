"""The message state machine, as a table.

Every change of a message's state goes through `next_state`; a pair the table does not list
raises `IllegalTransitionError` and changes nothing. Terminal states (ACKED, REMOVED) are not
kept: the message leaves the queue's state when it reaches one.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from broker.errors import IllegalTransitionError


class MessageState(StrEnum):
    AVAILABLE = "available"  # in the queue, deliverable
    LEASED = "leased"  # at-least-once: held by one subscription until ack or lease lapse
    SENT = "sent"  # at-most-once: gone from the queue, still counted in the holder's backlog
    ACKED = "acked"  # terminal
    REMOVED = "removed"  # terminal, with a reason (policy, expire request, at-most-once release)


class Action(StrEnum):
    ENQUEUE = "enqueue"
    LEASE = "lease"
    SEND = "send"
    ACK = "ack"
    RETURN = "return"  # lapse, cancel, unsubscribe or disconnect of the holder
    REMOVE = "remove"
    RELEASE = "release"  # an at-most-once message's backlog slot is freed without an ack


S, A = MessageState, Action

TRANSITIONS: Final[dict[tuple[MessageState | None, Action], MessageState]] = {
    (None, A.ENQUEUE): S.AVAILABLE,
    (S.AVAILABLE, A.LEASE): S.LEASED,
    (S.AVAILABLE, A.SEND): S.SENT,
    (S.AVAILABLE, A.ACK): S.ACKED,  # permissive leasing: acked while nobody holds it
    (S.AVAILABLE, A.REMOVE): S.REMOVED,
    (S.LEASED, A.ACK): S.ACKED,
    (S.LEASED, A.RETURN): S.AVAILABLE,
    (S.LEASED, A.REMOVE): S.REMOVED,
    (S.SENT, A.ACK): S.ACKED,
    (S.SENT, A.RELEASE): S.REMOVED,
}

TERMINAL: Final = frozenset({S.ACKED, S.REMOVED})


def next_state(state: MessageState | None, action: Action) -> MessageState:
    """The state `action` leads to from `state`; raise if the table does not allow it."""
    try:
        return TRANSITIONS[(state, action)]
    except KeyError:
        raise IllegalTransitionError(
            f"cannot {action.value} a message that is {state.value if state else 'not queued'}"
        ) from None
