"""Read-only commands that ask the running service: queues, inspect, subscribers."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.client import QueueClient
from broker.kafka import clients
from cli.common import (
    BootstrapOpt,
    ConfigOpt,
    JsonOpt,
    age,
    bootstrap_of,
    console,
    err_console,
    errors_to_exit_codes,
    load,
    print_json,
)
from cli.tables import Col, render

if TYPE_CHECKING:
    from broker.service.status import InstanceStatus

CLI_CLIENT = "kq-cli"  # all CLI invocations share one reply topic, told apart by request id


def ask(config: str | None, bootstrap: str | None, **args: Any) -> dict[str, Any]:
    """The service's answer. With several shards, one that does not answer (no owner just
    now) is named on stderr, and the command exits 1 once it has shown the others."""
    cfg = load(config)
    with errors_to_exit_codes(), QueueClient(bootstrap_of(bootstrap, cfg), name=CLI_CLIENT,
                     topic_prefix=cfg.service.topic_prefix,
                     kafka_config=dict(cfg.service.kafka)) as client:
        data = client.query(**args)
        for shard in data.get("unanswered_shards", ()):
            names = ", ".join(q.name for q in cfg.queues_of_shard(shard)) or "none"
            err_console.print(f"[yellow]shard {shard} did not answer (no owner just now? "
                              f"see kq instances); its queues are not shown: {names}[/]")
        return data
    raise AssertionError("unreachable")


def exit_if_partial(data: dict[str, Any]) -> None:
    if data.get("unanswered_shards"):
        raise typer.Exit(1)


def queues(config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
           json: JsonOpt = False) -> None:
    """One row per queue: depth, available, held, leased, subscribers, oldest age, acked,
    removed, and the shard and the instance that owns it."""
    data = ask(config, bootstrap_servers, what="queues")
    rows = data["queues"]
    if json:
        print_json(rows)
    else:
        render(console, QUEUE_COLUMNS, [
            (r["queue"], str(r["depth"]), str(r["available"]), str(r.get("held", 0)),
             str(r["leased"]), str(r["subscribers"]), age(r["oldest_age_ms"]),
             str(r["acked"]), str(r["dead_lettered"]), str(sum(r["removed"].values())),
             r["semantics"], str(r.get("shard", 0)), r.get("owner") or "-")
            for r in sorted(rows, key=lambda r: r["queue"])])
    exit_if_partial(data)


# dead: dead-lettered; subs: subscribers; semantics only when there is room
QUEUE_COLUMNS = (Col("queue", key=True), Col("depth", number=True), Col("avail", number=True),
                 Col("held", number=True, drop=5), Col("leased", number=True),
                 Col("subs", number=True),
                 Col("oldest", number=True), Col("acked", number=True, drop=4),
                 Col("dead", number=True, drop=3), Col("removed", number=True, drop=2),
                 Col("semantics", drop=1), Col("shard", number=True, drop=6),
                 Col("owner", drop=7))


def inspect(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    state: Annotated[str | None, typer.Option(help="Only messages in this state: available, "
                                               "held, leased or sent.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many messages.")] = 100,
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
                  f"held {s.get('held', 0)}, leased {s['leased']}, acked {s['acked']}, "
                  f"removed {removed(s['removed'])}"
                  + (f", groups held {s['groups_held']}" if s.get("groups_held") else ""))
    now = time.time() * 1000
    render(console, MESSAGE_COLUMNS, [
        (m["bookmark"], m["state"], str(m["delivery_count"]), str(m["cancel_count"]),
         m["holder"] or "-",
         until(m.get("not_before_ms") or m["lease_deadline_ms"], now),
         age(m["age_ms"]), m.get("group") or "-")
        for m in data["messages"]])
    shown = len(data["messages"])
    if data.get("truncated") and data.get("scanned", 0) > shown and filter:
        console.print(f"[dim]{shown} shown: the filter looked at the oldest "
                      f"{data['scanned']} messages only, so that a query cannot stall the "
                      "service[/]")
    elif data.get("truncated"):
        console.print(f"[dim]the oldest {shown} shown; --limit N for more[/]")


def removed(by_reason: dict[str, int] | int | None) -> str:
    """`3 (max-deliveries 2, expired 1)`: the count, and why, most first."""
    if not isinstance(by_reason, dict):
        return str(by_reason or 0)
    total = sum(by_reason.values())
    why = ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items(), key=lambda x: -x[1]))
    return f"{total} ({why})" if total else "0"


def until(at_ms: int | None, now: float) -> str:
    return age(max(0, int(at_ms - now))) if at_ms else "-"


# dlv: deliveries; cxl: cancels; lease: time left on the lease (held: until it is available)
MESSAGE_COLUMNS = (Col("bookmark", key=True), Col("state"), Col("dlv", number=True),
                   Col("cxl", number=True), Col("holder", key=True),
                   Col("lease", number=True), Col("age", number=True, drop=2),
                   Col("group", drop=1))


def subscribers(
    queue: Annotated[str | None, typer.Argument(help="Only this queue's subscriptions.")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Subscriptions (consumers and browsers) with their backlog, leased count and last
    heartbeat."""
    data = ask(config, bootstrap_servers, what="subscribers", queue=queue)
    rows = data["subscribers"]
    if json:
        print_json(rows)
    else:
        now = time.time() * 1000
        render(console, SUBSCRIBER_COLUMNS, [
            (r["client"], r["queue"], r["mode"], str(r["backlog"]), str(r["leased"]),
             f"{age(int(now - r['last_heartbeat_ms']))} ago" if r["last_heartbeat_ms"]
             else "-", r["sub_id"])
            for r in rows])
    exit_if_partial(data)


# heard: the client's last heartbeat; the subscription id only when there is room
SUBSCRIBER_COLUMNS = (Col("client", key=True), Col("queue", key=True), Col("mode"),
                      Col("backlog", number=True), Col("leased", number=True),
                      Col("heard", number=True), Col("subscription", drop=1))


def recovery_points(config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
                    json: JsonOpt = False) -> None:
    """Per queue and partition: the offset below which every message is finished."""
    data = ask(config, bootstrap_servers, what="recovery_points")
    rows = data["recovery_points"]
    if json:
        print_json(rows)
    else:
        render(console, (Col("queue", key=True), Col("topic", key=True),
                         Col("part", number=True), Col("point", number=True)),
               [(r["queue"], r["topic"], str(r["partition"]), str(r["offset"])) for r in rows])
    exit_if_partial(data)


def instances(config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None,
              json: JsonOpt = False) -> None:
    """The `kq serve` instances sharing this config's shards: the shards each owns and keeps
    warm (standby), how far behind each is, when it last reported, and where it runs (host
    and pid)."""
    from broker.service.status import read_statuses
    from broker.service.topics import Topics

    cfg = load(config)
    with errors_to_exit_codes():
        bootstrap = bootstrap_of(bootstrap_servers, cfg)
        clients.check_reachable(bootstrap, dict(cfg.service.kafka))
        consumer = clients.consumer(bootstrap, dict(cfg.service.kafka))
        try:
            found = read_statuses(consumer, Topics(cfg.service.topic_prefix).instances, bootstrap)
        finally:
            consumer.close()
    rows = instance_rows(found.values(), int(time.time() * 1000),
                         max(cfg.service.session_timeout.ms, 6000))
    if json:
        print_json(rows)
        return
    render(console, INSTANCE_COLUMNS, [
        (r["instance"], "yes" if r["live"] else "no", _shards(r["owned"]),
         _shards(r["standby"]), str(sum(v["records"] for v in r["lag"].values())),
         age(r["last_seen_ms"]), f"{r['host'] or '?'}:{r['pid'] or '?'}") for r in rows])


def instance_rows(found: Iterable[InstanceStatus], now: int, timeout: int
                  ) -> list[dict[str, Any]]:
    """One row per instance. One no longer live (killed, stopped, or silent past the
    timeout) owns and keeps warm nothing: the shards its last report named are
    `last_owned`, since taken over by the live ones."""
    rows = []
    for s in sorted(found, key=lambda s: s.instance):
        live = s.live(now, timeout)
        rows.append({"instance": s.instance, "live": live, "owned": s.owned if live else [],
                     "standby": s.standby if live else [], "last_owned": [] if live else s.owned,
                     "lag": s.lag if live else {}, "last_seen_ms": now - s.at_ms,
                     "host": s.host or None, "pid": s.pid or None})
    return rows


def _shards(shards: list[int]) -> str:
    return ",".join(map(str, shards)) or "-"


INSTANCE_COLUMNS = (Col("instance", key=True), Col("live"), Col("owned"), Col("standby"),
                    Col("lag", number=True), Col("seen", number=True), Col("host:pid"))
