"""Read-only commands that ask the running service: queues, inspect, subscribers."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from broker.client import QueueClient
from cli.common import (
    BootstrapOpt,
    ConfigOpt,
    JsonOpt,
    age,
    bootstrap_of,
    console,
    errors_to_exit_codes,
    load,
    print_json,
)

CLI_CLIENT = "kq-cli"  # all CLI invocations share one reply topic, told apart by request id


def ask(config: str | None, bootstrap: str | None, **args: Any) -> dict[str, Any]:
    cfg = load(config)
    with errors_to_exit_codes(), QueueClient(bootstrap_of(bootstrap, cfg), name=CLI_CLIENT,
                     topic_prefix=cfg.service.topic_prefix,
                     kafka_config=dict(cfg.service.kafka)) as client:
        return client.query(**args)
    raise AssertionError("unreachable")


def queues(config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
           json: JsonOpt = False) -> None:
    """One row per queue: depth, available, leased, subscribers, oldest age, acked, removed."""
    rows = ask(config, bootstrap_servers, what="queues")["queues"]
    if json:
        print_json(rows)
        return
    table = Table("queue", "semantics", "depth", "available", "leased", "subscribers",
                  "oldest", "acked", "dead-lettered", "removed")
    for r in rows:
        removed = sum(r["removed"].values())
        table.add_row(r["queue"], r["semantics"], str(r["depth"]), str(r["available"]),
                      str(r["leased"]), str(r["subscribers"]), age(r["oldest_age_ms"]),
                      str(r["acked"]), str(r["dead_lettered"]), str(removed))
    console.print(table)


def inspect(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    state: Annotated[str | None, typer.Option(help="Only messages in this state: available, "
                                               "leased or sent.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many messages.")] = 100,
    filter: Annotated[str | None, typer.Option(
        "--filter", help="Only messages this expression matches, e.g. \"/sym = 'IBM'\".")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """The queue's active messages: state, lease holder, deadline, delivery count."""
    data = ask(config, bootstrap_servers, what="inspect", queue=queue, state=state, limit=limit,
               filter=filter)
    if json:
        print_json(data)
        return
    s = data["summary"]
    console.print(f"[bold]{queue}[/]: depth {s['depth']}, available {s['available']}, "
                  f"leased {s['leased']}, acked {s['acked']}, removed {s['removed'] or 0}")
    table = Table("bookmark", "state", "deliveries", "cancels", "holder", "lease left", "age")
    now = time.time() * 1000
    for m in data["messages"]:
        left = m["lease_deadline_ms"]
        table.add_row(m["bookmark"], m["state"], str(m["delivery_count"]),
                      str(m["cancel_count"]), m["holder"] or "-",
                      age(max(0, int(left - now))) if left else "-", age(m["age_ms"]))
    console.print(table)


def subscribers(
    queue: Annotated[str | None, typer.Argument(help="Only this queue's subscriptions.")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Subscriptions (consumers and browsers) with their backlog, leased count and last
    heartbeat."""
    rows = ask(config, bootstrap_servers, what="subscribers", queue=queue)["subscribers"]
    if json:
        print_json(rows)
        return
    table = Table("client", "queue", "subscription", "mode", "backlog", "leased",
                  "last heartbeat")
    now = time.time() * 1000
    for r in rows:
        seen = r["last_heartbeat_ms"]
        table.add_row(r["client"], r["queue"], r["sub_id"][:12], r["mode"], str(r["backlog"]),
                      str(r["leased"]), f"{age(int(now - seen))} ago" if seen else "-")
    console.print(table)


def recovery_points(config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
                    json: JsonOpt = False) -> None:
    """Per queue and partition: the offset below which every message is finished."""
    rows = ask(config, bootstrap_servers, what="recovery_points")["recovery_points"]
    if json:
        print_json(rows)
        return
    table = Table("queue", "topic", "partition", "recovery point")
    for r in rows:
        table.add_row(r["queue"], r["topic"], str(r["partition"]), str(r["offset"]))
    console.print(table)
