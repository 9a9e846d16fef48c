"""The transitions a batch made, as the service's Prometheus metrics count them."""

from __future__ import annotations

from types import SimpleNamespace

from broker.engine.transitions import Kind, Reason, Transition, tally
from broker.service.metrics import Metrics
from broker.values import Bookmark


def _batch() -> list[Transition]:
    bm = [Bookmark("T", 0, i) for i in range(4)]
    return [Transition(Kind.LEASED, "Q", 1, bm[0], sub_id="s"),
            Transition(Kind.LEASED, "Q", 1, bm[1], sub_id="s"),
            Transition(Kind.ACKED, "Q", 2, bm[0], sub_id="s"),
            Transition(Kind.RETURNED, "Q", 2, bm[1], reason=Reason.LAPSED.value),
            Transition(Kind.REMOVED, "R", 3, bm[2], reason=Reason.EXPIRED.value),
            Transition(Kind.SUBSCRIBED, "R", 3, sub_id="s2")]


def test_a_batch_is_counted_by_queue_kind_and_reason():
    assert tally(_batch()) == {("Q", Kind.LEASED, ""): 2, ("Q", Kind.ACKED, ""): 1,
                               ("Q", Kind.RETURNED, "lapsed"): 1,
                               ("R", Kind.REMOVED, "expired"): 1,
                               ("R", Kind.SUBSCRIBED, ""): 1}


def test_the_counts_reach_prometheus_and_add_up_over_batches():
    metrics = Metrics()
    engine = SimpleNamespace(queues={})  # no queue state to report gauges for
    for _ in range(2):
        metrics.observe(engine, _batch(), records_in=3)  # type: ignore[arg-type]

    def sample(queue: str, kind: str, reason: str = "") -> float | None:
        return metrics.registry.get_sample_value(
            "kq_transitions_total", {"queue": queue, "kind": kind, "reason": reason})

    assert sample("Q", "leased") == 4 and sample("Q", "acked") == 2
    assert sample("Q", "returned", "lapsed") == 2 and sample("R", "removed", "expired") == 2
    assert sample("Q", "removed") is None
    assert metrics.registry.get_sample_value("kq_records_consumed_total") == 6
