"""A gap in a partition's offsets is read again once (broker.kafka.gaps): on the embedded
broker a consumer may be handed a record before an earlier one is readable."""

from confluent_kafka import KafkaError, KafkaException

from broker.kafka.gaps import GapCheck


class Rec:
    def __init__(self, offset: int, partition: int = 0, topic: str = "t") -> None:
        self._offset, self._partition, self._topic = offset, partition, topic

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return self._partition

    def topic(self) -> str:
        return self._topic

    def error(self) -> None:
        return None


class Consumer:
    def __init__(self, refuses: bool = False) -> None:
        self.seeks: list[tuple[str, int, int]] = []
        self.refuses = refuses

    def seek(self, tp) -> None:
        if self.refuses:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def offsets(records) -> list[tuple[int, int]]:
    return [(r.partition(), r.offset()) for r in records]


def test_a_gap_is_read_again_and_what_follows_it_waits():
    c = Consumer()
    gaps = GapCheck(c, enabled=True)
    gaps.moved("t", 0, 5)
    got = gaps.passed([Rec(5), Rec(7), Rec(8), Rec(3, partition=1)])
    assert offsets(got) == [(0, 5), (1, 3)]  # 7 and 8 come again after the seek
    assert c.seeks == [("t", 0, 6)]
    # read again: the missing record is there now
    assert offsets(gaps.passed([Rec(6), Rec(7), Rec(8)])) == [(0, 6), (0, 7), (0, 8)]
    assert gaps.read_again == 1


def test_a_gap_still_there_after_reading_again_is_real():
    c = Consumer()
    gaps = GapCheck(c, enabled=True)
    gaps.moved("t", 0, 0)
    assert offsets(gaps.passed([Rec(0), Rec(2)])) == [(0, 0)]  # (a transaction marker at 1)
    assert offsets(gaps.passed([Rec(2), Rec(3)])) == [(0, 2), (0, 3)]
    assert c.seeks == [("t", 0, 1)]  # once
    assert offsets(gaps.passed([Rec(5)])) == []  # a new gap is read again too
    assert c.seeks[-1] == ("t", 0, 4)


def test_reading_back_or_from_where_the_consumer_was_moved_is_no_gap():
    c = Consumer()
    gaps = GapCheck(c, enabled=True)
    assert offsets(gaps.passed([Rec(10), Rec(11)])) == [(0, 10), (0, 11)]  # nothing known
    assert offsets(gaps.passed([Rec(4)])) == [(0, 4)]  # sought back (a queue read again)
    gaps.moved("t", 0, 20)
    assert offsets(gaps.passed([Rec(20)])) == [(0, 20)]
    assert c.seeks == []


def test_on_apache_kafka_every_record_passes():
    c = Consumer()
    gaps = GapCheck(c, enabled=False)
    gaps.moved("t", 0, 0)
    assert offsets(gaps.passed([Rec(0), Rec(5)])) == [(0, 0), (0, 5)]
    assert c.seeks == []


def test_a_consumer_that_refuses_the_seek_reads_on():
    gaps = GapCheck(Consumer(refuses=True), enabled=True)
    gaps.moved("t", 0, 0)
    assert offsets(gaps.passed([Rec(0), Rec(2), Rec(3)])) == [(0, 0), (0, 2), (0, 3)]
    assert gaps.read_again == 0
