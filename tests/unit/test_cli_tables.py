"""The CLI's tables in an 80-column terminal: short headers, nothing cut, extras when wide."""

import io

from rich.console import Console

from cli.inspect import MESSAGE_COLUMNS, QUEUE_COLUMNS, SUBSCRIBER_COLUMNS
from cli.tables import render

QUEUES = [("ORDERS_ANALYTICS_DIRECT", "1000000", "999990", "0", "10", "4", "12.5h", "1234567",
           "12", "345", "at-least-once", "3", "kq-east-1"),
          ("ORDERS_RISK", "10", "0", "0", "10", "4", "1.2s", "7", "0", "0", "at-most-once",
           "0", "kq-east-2")]


def shown(columns, rows, width: int) -> str:
    out = io.StringIO()
    render(Console(file=out, width=width), columns, rows)
    return out.getvalue()


def test_queues_at_80_columns_show_whole_names_and_numbers():
    text = shown(QUEUE_COLUMNS, QUEUES, 80)
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    for row in QUEUES:
        line = next(li for li in text.splitlines() if row[0] in li)
        # name, depth, avail, (held: dropped when there is no room), leased, subs, age
        assert all(cell in line for cell in row[:3] + row[4:7])
    assert "depth" in text and "avail" in text and "oldest" in text


def test_wide_terminals_get_every_column():
    text = shown(QUEUE_COLUMNS, QUEUES, 200)
    assert "semantics" in text and "at-least-once" in text and "removed" in text
    assert "held" in text and "owner" in text and "kq-east-1" in text
    assert "semantics" not in shown(QUEUE_COLUMNS, QUEUES, 80)


def test_message_and_subscriber_tables_keep_bookmarks_and_clients_whole_at_80():
    messages = [("ORDERS_ANALYTICS_DIRECT/3/1234567", "leased", "3", "1", "worker-eu-west-17",
                 "59.0s", "1.2h", "cart-20931")]
    subs = [("worker-eu-west-17", "ORDERS_ANALYTICS_DIRECT", "queue", "50", "50", "0.4s ago",
             "5f0c2a9e41b7d3c8")]
    for columns, rows in ((MESSAGE_COLUMNS, messages), (SUBSCRIBER_COLUMNS, subs)):
        text = shown(columns, rows, 80)
        assert "…" not in text and all(len(li) <= 80 for li in text.splitlines())
        assert all(cell in text for cell in rows[0][:2])


def test_inspects_header_counts_removals_by_reason_in_words():
    from cli.inspect import removed

    assert removed({"expired": 1, "max-deliveries": 2}) == "3 (max-deliveries 2, expired 1)"
    assert removed({}) == "0" and removed(None) == "0" and removed(4) == "4"


def test_short_columns_are_never_squeezed_away_at_80_columns():
    from rich.console import Console

    from cli.journal import DUMP_COLUMNS
    from cli.tables import render

    console = Console(width=80, record=True)
    row = ("12", "345", "2026-11-25 05:00:01.123", "enqueued", "ORDERS_ANALYTICS_long",
           "orders.incoming/0/123456", "worker-host-1234-abcdef", "1", "0", "-")
    render(console, DUMP_COLUMNS, [row])
    text = console.export_text()
    assert "kind" in text and "enqueued" in text and "ORDERS_ANALYTICS_long" in text


def test_an_instance_no_longer_live_owns_nothing_and_names_what_it_last_owned():
    """A killed instance's row said it owned its shards, beside the live one that took
    them over."""
    from broker.service.status import InstanceStatus
    from cli.inspect import instance_rows
    dead = InstanceStatus("a", owned=[0, 2], standby=[1], lag={"1": {"records": 5}}, at_ms=1_000)
    live = InstanceStatus("b", owned=[0, 1, 2], standby=[], at_ms=19_000)
    rows = {r["instance"]: r for r in instance_rows([live, dead], now=20_000, timeout=6_000)}
    assert (rows["a"]["live"], rows["a"]["owned"], rows["a"]["standby"]) == (False, [], [])
    assert rows["a"]["last_owned"] == [0, 2] and rows["a"]["lag"] == {}
    assert (rows["b"]["live"], rows["b"]["owned"], rows["b"]["last_owned"]) == (True, [0, 1, 2], [])
