from broker.service.journal import BatchAssembler


def part(batch, i, n, marker=None):
    return {"batch": batch, "part": i, "parts": n, "marker": marker, "transitions": [i]}


def test_whole_batches_only_and_leftovers_of_a_crash_are_dropped():
    a = BatchAssembler()
    assert a.add(part(1, 0, 1)) == [part(1, 0, 1)]
    assert a.add(part(2, 0, 3)) is None
    assert a.add(part(2, 1, 3)) is None
    # crash: batch 2 never finished; after the restart marker, batch 2 is written again
    assert a.add(part(-1, 0, 0, marker="m")) is None
    assert a.add(part(2, 2, 3)) is None  # a stray tail is not a batch
    assert a.add(part(2, 0, 2)) is None
    assert a.add(part(2, 1, 2)) == [part(2, 0, 2), part(2, 1, 2)]
    assert a.add(part(3, 1, 2)) is None  # a batch without its start is dropped


def test_a_batch_journals_only_the_last_cursor_of_each_browser():
    from broker.engine.transitions import Kind, Transition
    from broker.service.commit import latest_cursors
    from broker.values import Bookmark

    def cursor(sub: str, seq: int) -> Transition:
        return Transition(Kind.BROWSED, "Q", 0, sub_id=sub, seq=seq)

    enq = Transition(Kind.ENQUEUED, "Q", 0, Bookmark("T", 0, 1), seq=1)
    batch = [cursor("a", 0), cursor("b", 0), enq, cursor("a", 1)]
    assert latest_cursors(batch) == [cursor("b", 0), enq, cursor("a", 1)]
