"""[auth] entitlements: principals may subscribe to and ack only the queues they may read."""

from broker.engine import events as ev
from broker.engine.engine import Engine
from broker.expr import Doc
from broker.values import Bookmark
from tests.unit.harness import Harness, delivered, queue, rejected


def entitled_harness() -> Harness:
    h = Harness(queue("ORDERS_A"), queue("ORDERS_B"), queue("SECRET"))
    h.engine = Engine(list(q.config for q in h.engine.queues.values()), 10_000,
                      auth={"worker-1": "^ORDERS_.*$", "auditor": "^SECRET$"})
    return h


def test_a_principal_may_subscribe_only_to_queues_it_may_read():
    h = entitled_harness()
    ok = h.handle(ev.Subscribed("c1", "s1", "ORDERS_A", 1, "r", None, "worker-1"))
    assert rejected(ok) == []
    refused = h.handle(ev.Subscribed("c1", "s2", "SECRET", 1, "r", None, "worker-1"))
    assert rejected(refused) == ["not entitled: 'worker-1' may not read queue 'SECRET'"]
    stranger = h.handle(ev.Subscribed("c9", "s3", "ORDERS_A", 1, "r", None, "nobody"))
    assert "not entitled" in rejected(stranger)[0]


def test_the_client_name_is_the_principal_by_default():
    h = entitled_harness()
    assert rejected(h.handle(ev.Subscribed("auditor", "s1", "SECRET", 1, "r"))) == []


def test_acks_cancels_expires_and_ack_where_are_checked_too():
    h = entitled_harness()
    bm = Bookmark("T", 0, 0)
    h.handle(ev.MessageArrived("SECRET", bm, h.now, 10, Doc({"a": 1}, {})))
    h.handle(ev.Subscribed("auditor", "s1", "SECRET", 1, "r"))
    assert delivered(h.effects) == [("auditor", bm, 1)]
    for event in (ev.Acked("w", "SECRET", (bm,), "a", "worker-1"),
                  ev.Cancelled("w", "SECRET", bm, "c", "worker-1"),
                  ev.ExpireRequested("w", "SECRET", bm, "e", "worker-1"),
                  ev.AckWhere("w", "SECRET", "/a = 1", "w", "worker-1")):
        assert "not entitled" in rejected(h.handle(event))[0]
    assert bm in h.engine.queue("SECRET").messages


def test_a_command_nobody_vouches_for_is_refused_on_an_entitled_queue():
    # the service passes "" for commands on the shared topic: with [auth] only a
    # principal's own command topic says who sent a command
    h = entitled_harness()
    out = h.handle(ev.Subscribed("worker-1", "s1", "ORDERS_A", 1, "r", None, ""))
    assert rejected(out) == ["not entitled: queue 'ORDERS_A' takes commands only on the "
                             "sender's own command topic (PREFIX.commands.<principal>)"]


def test_a_client_belongs_to_the_principal_that_subscribed_it():
    h = entitled_harness()
    bm = Bookmark("T", 0, 0)
    h.handle(ev.MessageArrived("ORDERS_A", bm, h.now, 10, Doc({}, {})))
    h.handle(ev.Subscribed("w1", "s1", "ORDERS_A", 1, "r", None, "worker-1"))
    assert delivered(h.effects) == [("w1", bm, 1)]
    # someone else naming that client: an ack of its lease, a close, a heartbeat
    out = h.handle(ev.Acked("w1", "ORDERS_A", (bm,), "a", "auditor"))
    assert rejected(out) == ["not entitled: client 'w1' belongs to principal 'worker-1'"]
    h.handle(ev.ClientClosed("w1", ""))
    assert "s1" in h.engine.subs and bm in h.engine.queue("ORDERS_A").messages
    h.now += 5_000
    h.handle(ev.Heartbeat("w1", ""))
    assert h.engine.last_seen["w1"] == h.now - 5_000  # a forged heartbeat keeps nobody alive
    assert rejected(h.handle(ev.Acked("w1", "ORDERS_A", (bm,), "a", "worker-1"))) == []


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PRINCIPALS = ["worker-1", "worker-2", "auditor", ""]
AUTH = {"worker-1": "^ORDERS_", "worker-2": "^ORDERS_", "auditor": "^SECRET$"}
CLIENTS = ["w1", "w2"]
ACTIONS = st.lists(st.tuples(
    st.sampled_from(["publish", "subscribe", "ack", "cancel", "close", "ack_where"]),
    st.sampled_from(CLIENTS), st.sampled_from(PRINCIPALS),
    st.sampled_from(["ORDERS_A", "SECRET"]), st.integers(0, 2)), max_size=40)


@settings(max_examples=400, deadline=None)
@given(ACTIONS)
def test_no_principal_ever_settles_what_it_may_not(actions):
    """Whatever anyone sends, under any name: an ack or cancel takes effect only for a
    principal entitled to the queue, and a lease is only ever settled by its own principal."""
    from broker.engine.effects import Journal
    from broker.engine.transitions import Kind

    h = Harness(queue("ORDERS_A"), queue("SECRET"))
    e = h.engine = Engine([q.config for q in h.engine.queues.values()], 10_000, auth=AUTH)
    allowed = {p: pattern.strip("^$") for p, pattern in AUTH.items()}
    holder_principal: dict[Bookmark, str | None] = {}
    for n, (kind, client, principal, qname, i) in enumerate(actions):
        bm = Bookmark(qname, 0, i)
        event = {
            "publish": ev.MessageArrived(qname, bm, h.now, 10, Doc({"i": i}, {})),
            "subscribe": ev.Subscribed(client, f"{client}-{qname}", qname, 2, f"r{n}", None,
                                       principal),
            "ack": ev.Acked(client, qname, (bm,), f"r{n}", principal),
            "cancel": ev.Cancelled(client, qname, bm, f"r{n}", principal),
            "close": ev.ClientClosed(client, principal),
            "ack_where": ev.AckWhere(client, qname, "/i >= 0", f"r{n}", principal),
        }[kind]
        for effect in h.handle(event):
            if not isinstance(effect, Journal):
                continue
            t = effect.transition
            if t.kind is Kind.LEASED:
                holder_principal[t.bookmark] = e.subs[t.sub_id].principal
            if t.kind in (Kind.ACKED, Kind.RETURNED) and kind != "publish":
                if kind != "close":  # leaving needs no entitlement; settling does
                    assert principal in allowed and t.queue.startswith(allowed[principal])
                owner = holder_principal.get(t.bookmark)
                assert owner in (None, principal), f"{principal!r} settled {owner!r}'s lease"
            if t.kind in (Kind.ACKED, Kind.RETURNED, Kind.REMOVED):
                holder_principal.pop(t.bookmark, None)
