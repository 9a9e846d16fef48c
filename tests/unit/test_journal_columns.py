"""A journal part's columns: Transitions are packed by a path of their own (columns no row
sets are not made), which must give the very bytes the generic path gives for any objects
with the same fields, and read back as the transitions written."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from broker.engine.transitions import Kind, Transition
from broker.service.columns import COLUMNS, decode_columns, encode_columns, transitions_in
from broker.values import Bookmark

texts = st.one_of(st.none(), st.text(max_size=6))
counts = st.one_of(st.just(0), st.integers(-(2**31), 2**31 - 1))
longs = st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1))
maybe_longs = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))

# Every field at its default or set, each independently (a batch mixes kinds)
transitions = st.builds(
    Transition, st.sampled_from(list(Kind)), st.text(max_size=6), st.integers(0, 2**62),
    bookmark=st.one_of(st.none(), st.builds(Bookmark, st.text(min_size=1, max_size=6),
                                            st.integers(0, 9), st.integers(0, 2**40))),
    sub_id=texts, client=texts, delivery_count=counts, cancel_count=counts,
    deadline_ms=maybe_longs, reason=texts, seq=longs, timestamp_ms=longs, max_backlog=counts,
    filter=texts, priority=st.one_of(st.none(), st.floats(allow_nan=False)),
    barrier=st.booleans(), browse=st.booleans(), principal=texts, not_before_ms=maybe_longs,
    size=maybe_longs, sort_text=texts, group=texts)


@given(st.lists(transitions, max_size=20))
def test_transitions_pack_as_any_object_with_their_fields(rows):
    alike = [SimpleNamespace(**{name: getattr(t, name) for name, _ in COLUMNS}) for t in rows]
    assert encode_columns(rows) == encode_columns(alike)


@given(st.lists(transitions, max_size=20))
def test_packed_transitions_read_back_as_written(rows):
    cols = encode_columns(rows)
    assert transitions_in({"columns": cols}) == rows
    assert len(decode_columns(cols)) == len(rows)


def test_a_batch_of_acks_leaves_the_other_columns_at_their_defaults():
    acks = [Transition(Kind.ACKED, "Q", 5, Bookmark("T", 0, i), client="w") for i in range(3)]
    back = decode_columns(encode_columns(acks))
    assert [(r["seq"], r["delivery_count"], r["deadline_ms"], r["browse"], r["group"])
            for r in back] == [(0, 0, None, False, None)] * 3
