"""`ops/bench_cpu.py` keeps working: the service's and the client's paths without Kafka
drain every message they were given (the figures it prints are only worth something then)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

import bench_cpu  # noqa: E402


def test_the_service_path_acks_every_message_it_was_given():
    assert bench_cpu.service_drain(600, backlog=10)() == 600


def test_the_client_path_hands_out_every_delivery_once():
    assert bench_cpu.client_drain(600, backlog=10)() == 600


def test_one_path_runs_alone_when_asked():
    """(`--path client` under callgrind counts the client's instructions only)"""
    assert set(bench_cpu.main(["--messages", "200", "--path", "client"])) == {"client_us_per_msg"}
    assert set(bench_cpu.main(["--messages", "200"])) == {"service_us_per_msg",
                                                          "client_us_per_msg"}


def test_the_steady_path_acks_every_message_as_they_arrive():
    assert bench_cpu.service_steady(600, backlog=10)() == 600
    assert set(bench_cpu.main(["--messages", "200", "--path", "steady"])) == {
        "steady_us_per_msg", "steady_mb_kept"}
