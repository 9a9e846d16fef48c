"""SPEC section 5: a message reaches every queue whose regex matches; queue-named topics forward."""

import pytest

from broker.client import QueueClient
from tests.integration.kit import config, drain, ensure_topic, publish, running_service, uid

pytestmark = pytest.mark.integration


def test_the_orders_table_of_the_spec_holds(bootstrap, tmp_path):
    u = uid()
    orders, analytics, risk = f"ORDERS_{u}", f"ORDERS_{u}_ANALYTICS", f"ORDERS_{u}_RISK"
    for t in (orders, analytics, f"{analytics}_DIRECT", risk, f"{risk}_DIRECT"):
        ensure_topic(bootstrap, t)
    cfg = config(f"kq{u}", str(tmp_path), [
        {"name": analytics, "underlying_topic": f"^({orders}|{analytics}_DIRECT)$"},
        {"name": risk, "underlying_topic": f"^({orders}|{risk}_DIRECT)$"},
    ])
    with running_service(bootstrap, cfg), QueueClient(bootstrap, topic_prefix=f"kq{u}") as c:
        a = c.subscribe(analytics, max_backlog=10)
        r = c.subscribe(risk, max_backlog=10)
        publish(bootstrap, orders, [b'{"n": "to-both"}'])
        publish(bootstrap, analytics, [b'{"n": "to-analytics"}'])
        publish(bootstrap, risk, [b'{"n": "to-risk"}'])
        got_a = sorted(m.data["n"] for m in drain(a, 2))
        got_r = sorted(m.data["n"] for m in drain(r, 2))
        assert got_a == ["to-analytics", "to-both"]
        assert got_r == ["to-both", "to-risk"]
        # and nothing more arrives on either
        assert drain(a, 1, timeout=1.0) == [] and drain(r, 1, timeout=0.2) == []


def test_a_forwarded_message_carries_its_origin(bootstrap, tmp_path):
    u = uid()
    name = f"Q_{u}"
    for t in (name, f"{name}_DIRECT"):
        ensure_topic(bootstrap, t)
    cfg = config(f"kq{u}", str(tmp_path), [{"name": name, "underlying_topic": f"^{name}_DIRECT$"}])
    with running_service(bootstrap, cfg), QueueClient(bootstrap, topic_prefix=f"kq{u}") as c:
        sub = c.subscribe(name)
        (origin,) = publish(bootstrap, name, [b'{"x": 1}'])
        (msg,) = drain(sub, 1)
        assert msg.bookmark.startswith(f"{name}_DIRECT/")
        assert (("kq-forwarded-from", origin.encode())) in msg.headers


def test_a_topic_created_after_the_service_started_is_picked_up(bootstrap, tmp_path):
    u = uid()
    cfg = config(f"kq{u}", str(tmp_path),
                 [{"name": f"LATE_{u}", "underlying_topic": f"^LATE_{u}_.*$"}])
    with running_service(bootstrap, cfg), QueueClient(bootstrap, topic_prefix=f"kq{u}") as c:
        sub = c.subscribe(f"LATE_{u}", max_backlog=5)
        publish(bootstrap, f"LATE_{u}_new", [b'{"late": true}'])
        (msg,) = drain(sub, 1, timeout=15)
        assert msg.data == {"late": True}
