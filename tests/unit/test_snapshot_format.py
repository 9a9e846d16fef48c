"""The snapshot layout on PREFIX.snapshots: chunks that give back every entry, and the choice
of the snapshot a restore loads (broker.state.snapshot)."""

from hypothesis import given
from hypothesis import strategies as st

from broker import wire
from broker.state import snapshot as fmt

META = {"offset": 41, "batch": 7}


def records_of(shard, snapshot, entries, first_offset=0, chunk_bytes=64, replaces=None,
               finished=True):
    """(offset, key, value) records as a writer lays them out."""
    out = []
    offset = first_offset
    count = n_entries = 0
    for key, value, n in fmt.chunks(entries, shard, snapshot, chunk_bytes):
        out.append((offset, key, value))
        offset, count, n_entries = offset + 1, count + 1, n_entries + n
    if finished:
        meta = {**META, "offset": int(snapshot.split("-")[0])}
        out.append((offset, fmt.complete_key(shard, snapshot),
                    fmt.complete(shard, snapshot, count, n_entries, first_offset, meta, 1000,
                                 replaces or {})))
    return out


@given(st.dictionaries(st.binary(min_size=1, max_size=30), st.binary(max_size=200),
                       max_size=60))
def test_chunks_give_back_every_entry_in_order(store):
    entries = sorted(store.items())
    got = []
    for _, value, n in fmt.chunks(entries, 3, "000000000001-ab", chunk_bytes=100):
        chunk = list(fmt.entries_of(wire.decode("snapshot", value)))
        assert len(chunk) == n
        got += chunk
    assert got == entries


def test_a_big_state_is_cut_into_chunks_under_the_size():
    entries = [(b"p\x00T/0/%d" % i, b"x" * 1000) for i in range(100)]
    sizes = [len(v) for _, v, _ in fmt.chunks(entries, 0, "000000000001-ab", chunk_bytes=10_000)]
    assert len(sizes) == 10
    assert max(sizes) < 12_000


def test_the_newest_complete_snapshot_is_chosen_and_a_cut_one_is_a_leftover():
    entries = [(b"m\x00Q\x00T/0/%d" % i, b"v" * 20) for i in range(10)]
    old = records_of(0, "000000000010-aa", entries)
    new = records_of(0, "000000000020-bb", entries, first_offset=len(old),
                     replaces={"000000000010-aa": 99})
    cut = records_of(0, "000000000030-cc", entries, first_offset=len(old) + len(new),
                     finished=False)
    seen = fmt.survey(0, old + new + cut)
    assert [f.snapshot for f in seen.complete] == ["000000000020-bb", "000000000010-aa"]
    newest = seen.complete[0]
    assert (newest.journal_offset, newest.first_offset) == (20, len(old))
    assert newest.offset == len(old) + len(new) - 1
    # what the next snapshot deletes: the cut one, the older complete one (with the chunk
    # count its successor named, the larger)
    assert seen.leftovers == {"000000000030-cc": len(cut), "000000000010-aa": 99}


def test_a_zombies_late_snapshot_of_an_older_state_is_not_the_newest():
    entries = [(b"k", b"v")]
    successor = records_of(0, "000000000050-new", entries)
    zombie = records_of(0, "000000000040-old", entries, first_offset=len(successor))
    seen = fmt.survey(0, successor + zombie)
    assert seen.complete[0].snapshot == "000000000050-new"


def test_deleted_snapshots_and_other_shards_are_ignored():
    entries = [(b"k", b"v")]
    gone = records_of(1, "000000000010-aa", entries)
    tombstones = [(len(gone) + i, key, None) for i, key in
                  enumerate(fmt.keys_of(1, "000000000010-aa", 1))]
    other_shard = records_of(2, "000000000099-zz", entries, first_offset=100)
    seen = fmt.survey(1, gone + tombstones + other_shard)
    assert seen.complete == []
    assert seen.leftovers == {}


def test_an_empty_store_still_makes_one_chunk():
    ((key, value, n),) = list(fmt.chunks([], 0, "000000000001-ab"))
    assert n == 0 and key == fmt.chunk_key(0, "000000000001-ab", 0)
    assert list(fmt.entries_of(wire.decode("snapshot", value))) == []
