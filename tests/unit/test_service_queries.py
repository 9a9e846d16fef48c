"""A query the service cannot answer is refused to its client; the service goes on."""

import json
import sys
import time
from pathlib import Path

from broker import wire
from broker.client.core import ClientCore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))

import bench_cpu  # noqa: E402


def _ask(svc, core: ClientCore, **args) -> dict:
    """The envelope the service puts in its outbox for one query of `core`'s."""
    _, records = core.request("query", query=json.dumps(args))
    batch = bench_cpu._batch(svc)
    for out in records:
        svc._command(bench_cpu._record("kq.commands", out.value), None,
                     int(time.time() * 1000), batch)
    (reply,) = batch.outbox.deliveries
    return wire.decode("envelope", reply.value)


def test_a_query_that_fails_inside_the_service_is_refused_and_the_next_one_answered(tmp_path):
    svc, _ = bench_cpu._service(tmp_path)
    core = ClientCore("cli", "")
    # a malformed client's query (the CLI checks its own --limit): read again after a
    # restart, a raise here would stop kq serve each time
    refused = _ask(svc, core, what="inspect", queue="Q", limit="many")
    assert refused["kind"] == "error" and "ValueError" in refused["error"]
    answered = _ask(svc, core, what="inspect", queue="Q")
    assert answered["kind"] == "reply" and json.loads(answered["body"])["messages"] == []
