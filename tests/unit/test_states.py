import pytest

from broker.engine.states import TRANSITIONS, Action, MessageState, next_state
from broker.errors import IllegalTransitionError

S, A = MessageState, Action


@pytest.mark.parametrize(("state", "action", "expected"), [
    (None, A.ENQUEUE, S.AVAILABLE),
    (S.AVAILABLE, A.LEASE, S.LEASED),
    (S.AVAILABLE, A.SEND, S.SENT),
    (S.AVAILABLE, A.ACK, S.ACKED),
    (S.AVAILABLE, A.REMOVE, S.REMOVED),
    (S.LEASED, A.ACK, S.ACKED),
    (S.LEASED, A.RETURN, S.AVAILABLE),
    (S.LEASED, A.REMOVE, S.REMOVED),
    (S.SENT, A.ACK, S.ACKED),
    (S.SENT, A.RELEASE, S.REMOVED),
])
def test_each_row_of_the_table(state, action, expected):
    assert next_state(state, action) is expected


def test_the_table_has_exactly_the_tested_rows():
    assert len(TRANSITIONS) == 10


@pytest.mark.parametrize(("state", "action"), [
    (S.LEASED, A.LEASE),  # never two leases on one message
    (S.SENT, A.RETURN),  # an at-most-once message never comes back
    (S.SENT, A.LEASE),
    (S.AVAILABLE, A.RETURN),
    (S.ACKED, A.LEASE),
    (S.REMOVED, A.RETURN),
    (None, A.ACK),
])
def test_illegal_transitions_raise(state, action):
    with pytest.raises(IllegalTransitionError):
        next_state(state, action)
