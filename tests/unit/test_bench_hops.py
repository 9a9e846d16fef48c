"""ops/bench_hops.py splits each message's latency into the service's hops."""

from ops.bench_hops import split, summary


def test_each_message_is_split_where_the_journal_and_its_envelope_say():
    received = {"Q/0/1": (130.0, 100.0), "Q/0/2": (150.0, 101.0), "Q/0/3": (160.0, 102.0)}
    leased = {"Q/0/1": 110, "Q/0/2": 111}
    produced = {"Q/0/1": 125, "Q/0/2": 140}
    rows = split(received, leased, produced)  # Q/0/3 left out: the journal lacks it
    assert rows == [(10.0, 15.0, 5.0, 30.0), (10.0, 29.0, 10.0, 49.0)]
    for hop in rows:
        assert hop[0] + hop[1] + hop[2] == hop[3]
    assert summary(rows)["commit"] == {"p50_ms": 29.0, "p90_ms": 29.0, "p99_ms": 29.0}
