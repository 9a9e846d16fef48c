"""Quick manual use: `kq publish` and `kq consume`."""

from __future__ import annotations

import json as jsonlib
import re
import sys
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException

from broker.client import QueueClient
from broker.kafka import clients
from cli.common import (
    EXIT_USAGE,
    BootstrapOpt,
    ConfigOpt,
    JsonOpt,
    bootstrap_of,
    console,
    errors_to_exit_codes,
    fail,
    load,
    print_json,
)

KAFKA_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def publish(
    topic: Annotated[str, typer.Argument(help="Underlying Kafka topic to write to.")],
    payload: Annotated[str, typer.Argument(
        help="The message: a JSON document, @FILE to read it from a file, or - to read it "
             "from standard input.")],
    key: Annotated[str | None, typer.Option(help="Record key.")] = None,
    header: Annotated[list[str] | None, typer.Option(
        help="NAME=VALUE, repeatable (e.g. region=EU).")] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Publish one JSON message to a topic with a plain Kafka producer; print its bookmark."""
    if not KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."):
        fail(f"bad topic name {topic!r}: Kafka's are 1-249 of a-z A-Z 0-9 . _ -", EXIT_USAGE)
    value = _payload(payload)
    try:
        jsonlib.loads(value)
    except ValueError as exc:
        fail(f"the payload is not JSON: {exc}", EXIT_USAGE)
    headers: list[tuple[str, str | bytes | None]] = []
    for h in header or []:
        name, sep, text = h.partition("=")
        if not sep or not name:
            fail(f"bad --header {h!r}: use NAME=VALUE", EXIT_USAGE)
        headers.append((name, text.encode()))
    cfg = load(config)
    bootstrap = bootstrap_of(bootstrap_servers, cfg)
    extra = dict(cfg.service.kafka)
    with errors_to_exit_codes():
        clients.check_reachable(bootstrap, extra)
    result: dict[str, str] = {}
    producer = clients.producer(bootstrap, extra)

    def on_delivery(err, msg) -> None:  # noqa: ANN001
        if err is None:
            result["bookmark"] = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        else:
            result["error"] = err.str()

    try:
        producer.produce(topic, value, key.encode() if key else None, headers=headers,
                         on_delivery=on_delivery)
    except (KafkaException, BufferError) as exc:  # refused before sending: too large, ...
        detail = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        fail(f"cannot publish {len(value):,} bytes to {topic!r}: {detail} (a producer sends "
             "at most message.max.bytes, 1 MB by default: [service.kafka] sets it)", EXIT_USAGE)
    producer.flush(15)
    if "bookmark" not in result:
        fail(f"publish to {topic} failed: {result.get('error', 'not acknowledged in 15s')}")
    if json:
        print_json(result)
    else:
        console.print(f"published {result['bookmark']}")


def _payload(given: str) -> bytes:
    """The payload as given, or read from @FILE or standard input (-): a payload too large
    for the shell's argument list, or one made by another program."""
    if given == "-":
        read = sys.stdin.buffer.read()
        if not read.strip():
            fail("the payload from standard input is empty", EXIT_USAGE)
        return read
    if given == "@":
        fail("@ names no file: use @FILE", EXIT_USAGE)
    if given.startswith("@"):
        try:
            return Path(given[1:]).read_bytes()
        except OSError as exc:
            fail(f"cannot read the payload file {given[1:]!r}: {exc.strerror}", EXIT_USAGE)
    return given.encode()


def consume(
    queue: Annotated[str, typer.Argument(help="Queue to subscribe to.")],
    count: Annotated[int, typer.Option(min=0, help="Stop after this many messages (0: no "
                                                  "limit).")] = 0,
    timeout: Annotated[float, typer.Option(help="Stop after this many seconds with nothing "
                                           "new.")] = 5.0,
    max_backlog: Annotated[int, typer.Option(min=1, help="Messages leased at once.")] = 1,
    ack: Annotated[bool, typer.Option(
        help="Acknowledge each message. --no-ack only looks: the messages stay leased until "
             "the command ends, then all go back to the queue (one delivery each).")] = True,
    name: Annotated[str | None, typer.Option(help="Client name (default: unique).")] = None,
    browse: Annotated[bool, typer.Option(
        "--browse", help="Only look: print a copy of every message in the queue and of new "
                         "ones, leasing and acknowledging nothing.")] = False,
    replay_period: Annotated[str | None, typer.Option(
        help="With --browse: start with the messages published this long ago, e.g. 60s "
             "(default: everything in the queue).")] = None,
    filter: Annotated[str | None, typer.Option(
        "--filter", help="Only messages this expression matches, e.g. \"/sym = 'IBM'\".")
    ] = None,
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Subscribe to a queue and print what arrives, acknowledging each message (or, with
    --browse, only looking). Exits 1 if the service refused any of its acks (a lease that
    lapsed first)."""
    if replay_period is not None and not browse:
        fail("--replay-period applies to --browse only", EXIT_USAGE)
    cfg = load(config)
    seen = 0
    if not ack and count:  # every message to show is held leased at once
        max_backlog = max(max_backlog, count)
    with errors_to_exit_codes(), QueueClient(
            bootstrap_of(bootstrap_servers, cfg), name=name,
            topic_prefix=cfg.service.topic_prefix, kafka_config=dict(cfg.service.kafka)) as c:
        sub = c.subscribe(queue, filter=filter, max_backlog=max_backlog,
                          mode="browse" if browse else "queue", replay_period=replay_period)
        for msg in sub.messages(timeout=timeout):
            row = {"bookmark": msg.bookmark, "delivery_count": msg.delivery_count,
                   "data": msg.data if msg.data is not None else
                   (msg.value or b"").decode("utf-8", "replace")}
            if json:
                print(jsonlib.dumps(row), flush=True)
            else:
                console.print(f"[bold]{msg.bookmark}[/] (delivery {msg.delivery_count}): "
                              f"{jsonlib.dumps(row['data'])}", highlight=False)
            # Not acked: kept leased, not cancelled one by one (a cancelled message comes
            # straight back to this subscription, a delivery more each time); closing the
            # subscription gives them all back at once.
            if ack:
                msg.ack()
            seen += 1
            if count and seen >= count:
                break
        sub.close()  # (its answer comes after the refusals of the acks sent before it)
        refused = list(c.errors)
    if not json:
        console.print(f"{seen} message(s)")
    if refused:  # shown, but not acked: the exit code must say so
        fail(f"{len(refused)} ack(s) refused, e.g. {refused[0]}")


ACK_WHERE_S = 120.0  # how long `kq ack --where` waits for the service's answer


def ack(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    where: Annotated[str, typer.Option("--where", help="Expression: ack every active message "
                                       "it matches, e.g. \"/status = 'void'\".")],
    config: ConfigOpt = None, bootstrap_servers: BootstrapOpt = None, json: JsonOpt = False,
) -> None:
    """Acknowledge by filter: every active message of the queue the expression matches
    (leased ones too where `leasing = "permissive"`), of those queued when asked. The
    service reads each one (about 40 µs a message compiled) a part at a time, serving its
    other work between the parts; this waits up to 120 s for its answer."""
    cfg = load(config)
    # The service reads the whole queue, each message's payload included (about 40 µs per
    # message compiled, a part at a time: 400,000 queued take some 16 s), so the answer is
    # given longer than a lookup's 10 s.
    with errors_to_exit_codes(), QueueClient(
            bootstrap_of(bootstrap_servers, cfg), name="kq-cli", request_timeout=ACK_WHERE_S,
            topic_prefix=cfg.service.topic_prefix, kafka_config=dict(cfg.service.kafka)) as c:
        count = c.ack_where(queue, where)
    if json:
        print_json({"queue": queue, "acked": count})
    else:
        console.print(f"acked {count} message(s) of {queue}")
