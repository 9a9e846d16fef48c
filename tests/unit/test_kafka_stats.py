"""The benchmark's Kafka request counts: librdkafka's statistics summed per process, and the
difference between two readings."""

import json

import pytest

from broker.kafka import stats


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(stats, "_latest", {})
    monkeypatch.setattr(stats, "_written", 0.0)
    monkeypatch.setattr(stats, "WRITE_EVERY_S", 0.0)  # every report written (but one test)


def report(name: str, produce: int, fetch: int, out: int, into: int) -> str:
    return json.dumps({
        "name": name, "txmsgs": out, "rxmsgs": into, "tx_bytes": out * 100, "rx_bytes": into * 90,
        "brokers": {
            "127.0.0.1:9092/bootstrap": {"req": {"Metadata": 1, "Produce": 0}},
            "127.0.0.1:9092/1": {"req": {"Produce": produce, "Fetch": fetch, "Heartbeat": 0}},
        }})


def test_a_process_keeps_the_totals_of_all_its_clients_and_a_reader_takes_differences(
        tmp_path, monkeypatch):
    monkeypatch.setenv(stats.ENV, str(tmp_path))
    assert stats.settings()["statistics.interval.ms"] == stats.INTERVAL_MS
    stats._on_stats(report("producer-1", produce=10, fetch=0, out=500, into=0))
    stats._on_stats(report("consumer-2", produce=0, fetch=40, out=0, into=480))
    first = stats.read(tmp_path)
    assert first["requests"] == {"Metadata": 2, "Produce": 10, "Fetch": 40}
    assert (first["records_out"], first["records_in"]) == (500, 480)
    # a later report of one client replaces its earlier one (the figures are cumulative)
    stats._on_stats(report("producer-1", produce=25, fetch=0, out=900, into=0))
    later = stats.difference(stats.read(tmp_path), first)
    assert later["requests"] == {"Fetch": 0, "Metadata": 0, "Produce": 15}
    assert (later["records_out"], later["bytes_out"]) == (400, 40_000)


def test_without_the_variable_no_client_is_changed(monkeypatch, tmp_path):
    monkeypatch.delenv(stats.ENV, raising=False)
    assert stats.settings() == {}
    assert stats.read(tmp_path / "nothing")["requests"] == {}


def test_clients_polled_from_several_threads_report_without_a_failure(tmp_path, monkeypatch):
    """librdkafka calls back in whichever thread polls: the service polls its clients from
    several, and a failed write must never surface in a poll."""
    import threading

    monkeypatch.setenv(stats.ENV, str(tmp_path))
    failures = []

    def client(name: str) -> None:
        try:
            for i in range(50):
                stats._on_stats(report(name, produce=i, fetch=i, out=i, into=i))
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(f"c{n}",)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert stats.read(tmp_path)["requests"]["Produce"] == 8 * 49


def test_reports_close_together_are_written_once_and_a_settle_writes_the_last(
        tmp_path, monkeypatch):
    """Writing the file is what costs (a process has several clients, each reporting every
    second): at most one write per WRITE_EVERY_S, and the last figures on settle."""
    monkeypatch.setenv(stats.ENV, str(tmp_path))
    monkeypatch.setattr(stats, "WRITE_EVERY_S", 60.0)
    stats._on_stats(report("producer-1", produce=1, fetch=0, out=1, into=0))
    stats._on_stats(report("producer-1", produce=2, fetch=0, out=2, into=0))
    assert stats.read(tmp_path)["requests"]["Produce"] == 1
    stats.settle()
    assert stats.read(tmp_path)["requests"]["Produce"] == 2


def test_the_bench_counts_per_message_what_each_role_did_since_its_reading(tmp_path, monkeypatch):
    """The paced phase reuses the drain's service (counted from a reading) and starts new
    workers (counted from zero)."""
    from ops.bench_kafka import counters_now, grown_per_msg
    folders = {"service": tmp_path / "service", "subscribers": tmp_path / "subscribers"}
    monkeypatch.setenv(stats.ENV, str(folders["service"]))
    stats._on_stats(report("service-producer", produce=100, fetch=0, out=1000, into=0))
    before = counters_now(folders)
    stats._on_stats(report("service-producer", produce=150, fetch=0, out=1500, into=0))
    monkeypatch.setattr(stats, "_latest", {})
    monkeypatch.setenv(stats.ENV, str(folders["subscribers"]))
    stats._on_stats(report("worker-consumer", produce=0, fetch=20, out=0, into=500))
    grown = grown_per_msg(folders, {"service": before["service"]}, 500)
    assert grown["service"]["requests"] == 0.1 and grown["service"]["records_out"] == 1.0
    assert grown["subscribers"]["by_kind"] == {"Fetch": 0.04, "Metadata": 0.002}
    assert grown["subscribers"]["records_in"] == 1.0
