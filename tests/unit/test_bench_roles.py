"""ops/bench_roles.py: every phase's paced run starts once each worker has a record, and only
the paced run's records are timed (SPEC 13)."""

from pathlib import Path

from ops import bench_roles


def test_the_warm_up_publishes_until_every_worker_has_a_record(tmp_path, monkeypatch):
    ready = [tmp_path / f"w{i}.ready" for i in range(3)]
    published: list[str] = []

    def publish(bs: str, topic: str, n: int) -> None:  # worker k gets the k-th record
        published.append(topic)
        ready[len(published) - 1].write_text("1")

    monkeypatch.setattr(bench_roles, "publish", publish)
    monkeypatch.setattr(bench_roles.time, "sleep", lambda s: None)
    assert bench_roles.warm_up("bs", "T", ready) == 3
    assert published == ["T"] * 3


def test_a_warm_up_gives_up_after_its_time(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_roles, "publish", lambda bs, topic, n: None)
    monkeypatch.setattr(bench_roles.time, "sleep", lambda s: None)
    assert bench_roles.warm_up("bs", "T", [Path(tmp_path / "never")], within_s=0.01) > 0


def test_paced_records_carry_the_mark_warm_up_records_do_not(monkeypatch):
    sent: list[bytes] = []

    class Producer:
        def produce(self, topic, value, partition):
            sent.append(value)

        def poll(self, timeout):
            return 0

        def flush(self, timeout):
            return 0

    monkeypatch.setattr(bench_roles, "_producer", lambda bs: Producer())
    bench_roles.publish("bs", "T", 2)
    bench_roles.publish("bs", "T", 2, paced=True)
    assert [bench_roles.PACED in v for v in sent] == [False, False, True, True]
