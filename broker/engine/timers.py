"""Time passing: leases lapse, messages expire, silent clients lose their subscriptions (and
are told).

A part of the engine (its base class): each timer is a heap with lazy invalidation.
"""

from __future__ import annotations

import heapq
from typing import Final

from mypy_extensions import trait

from broker.engine.effects import Reply
from broker.engine.part import EnginePart
from broker.engine.queue import QueueState
from broker.engine.states import MessageState
from broker.engine.transitions import Reason
from broker.values import NOTICE, Bookmark

# How often the available messages are checked again for filters that read the clock.
CLOCK_RECHECK_MS: Final = 100
# Paged-out messages that expire per tick at most (a deep queue expiring all at once is
# emptied over several ticks, never stalling one)
EXPIRE_BATCH: Final = 5_000


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class Timers(EnginePart):
    def deaf_for(self, ms: int) -> None:
        """The service did not run for `ms` (frozen, swapped out): the clients' heartbeats of
        that time wait unread in Kafka, so it does not count as their silence."""
        for client in self.last_seen:
            self.last_seen[client] += ms

    def _drop_client(self, client: str, now: int, reason: Reason) -> list[str]:
        """End every subscription of `client`; return their ids."""
        ended = [self.subs[i] for i in sorted(self.sub_ids_of.get(client, ()))]
        for sub in ended:
            self._end_subscription(sub, now, reason)
        return [s.sub_id for s in ended]

    def _heard(self, client: str, instance: str | None = None) -> None:
        """A client heartbeats to a shard only while it believes it has subscriptions there:
        when it has none (dropped, and the notice lost to a crash or a failover; or made
        before a restart without their queue), say so, and it subscribes again."""
        if client not in self.sub_ids_of:
            self._out.append(Reply(client, NOTICE, {"notice": "no-subscriptions"}))
        if instance:
            self._one_process(client, instance)

    def _one_process(self, client: str, instance: str) -> None:
        """A client name is one process's: two live ones using it share its subscriptions'
        fate (a close by one ends the other's, and a dead one's live on while the other
        heartbeats). When their heartbeats alternate, both are told, once. A restarted
        process's new instance does not alternate: the old one is silent."""
        latest, before, told = self.speakers.get(client, (instance, "", False))
        if instance != latest:
            if instance == before and not told:
                told = True
                self._out.append(Reply(client, NOTICE, {"notice": "name-in-use"}))
            latest, before = instance, latest
        self.speakers[client] = (latest, before, told)

    def _tick(self, now: int) -> None:
        for q in self.queues.values():
            self._lapse_leases(q, now)
            self._expire_available(q, now)
            if q.hold_timers and q.release_due(now):
                self._touched.add(q.name)  # held messages became available
            if q.flow_paused is None and q.config.overflow_policy == "flow-control":
                self._touched.add(q.name)  # say once after a start whether it is paused
            if q.group_scan is not None:
                self._touched.add(q.name)  # a look for message groups in the pager goes on
            if any(b.looked_upto < q.stats.next_seq - 1 for b in q.browsers.values()):
                self._touched.add(q.name)  # browsers still catching up
            if (q.available and now - q.clock_checked_ms >= CLOCK_RECHECK_MS
                    and any(s.filter is not None and s.filter.uses_time
                            for s in q.subs.values())):
                q.clock_checked_ms = now  # a filter reading NOW() may match by now
                self._touched.add(q.name)
        silent = [c for c, seen in self.last_seen.items()
                  if now - seen >= self.heartbeat_timeout_ms]
        for client in silent:
            dropped = self._drop_client(client, now, Reason.DISCONNECTED)
            del self.last_seen[client]
            self.speakers.pop(client, None)
            if dropped:  # it may be alive, only slow: tell it, so it can subscribe again
                self._out.append(Reply(client, NOTICE, {
                    "notice": "dropped", "sub_ids": dropped,
                    "reason": f"no heartbeat for {self.heartbeat_timeout_ms} ms"}))

    def _lapse_leases(self, q: QueueState, now: int) -> None:
        timers = q.lease_timers
        while timers and timers[0][0] <= now:
            deadline, _, dc, bm = heapq.heappop(timers)
            msg = q.messages.get(bm)
            if msg is None or msg.deadline_ms != deadline or msg.delivery_count != dc:
                continue  # stale: acked, returned or re-leased since
            self._give_back(q, msg, now, Reason.LAPSED)

    def _expire_available(self, q: QueueState, now: int) -> None:
        """Messages past their expiry leave, unless leased (checked again when they come
        back). Timers of paged-out messages are in the pager: EXPIRE_BATCH per tick."""
        timers = q.expiry_timers
        due: list[tuple[int, int, Bookmark]] = []
        while timers and timers[0][0] <= now:
            due.append(heapq.heappop(timers))
        if q.pager is not None:  # (even with nothing paged out now: a refill took them)
            due += q.pager.due_timers(q.name, now, EXPIRE_BATCH)
        for _, seq, bm in due:
            msg = q.find(bm)
            if msg is not None and msg.state is MessageState.AVAILABLE and msg.seq == seq:
                self._remove(q, msg, now, Reason.EXPIRED)

