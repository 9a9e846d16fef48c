"""A `kq serve` process: the shards it serves, decided by Kafka's group protocol.

Every instance of one config joins the consumer group PREFIX.service on the command topic,
which has one partition per shard (cooperative-sticky assignment). The partitions the group
assigns are the shards this instance owns, each served by a `Service` in a thread of its own.
On assign a shard's service restores (local RocksDB + the journal tail) and writes its
takeover marker first (broker.service.fence); on revoke it finishes its batch and stops. The
group's member only holds the assignment: each shard's service reads its commands itself.

With `standby_replicas = 1` each shard is also kept warm by the next live instance after
its owner, in name order (broker.service.standby). Who is live and who owns what comes from
the instances' own status records on PREFIX.instances (what `kq instances` reads).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TopicPartition

from broker.config import Config
from broker.errors import ConfigError, FencedError
from broker.kafka import clients
from broker.service import joining
from broker.service.metrics import Metrics
from broker.service.service import Service
from broker.service.standby import Standby
from broker.service.status import InstanceStatus, StatusBoard, kq_serve_runs, refuse_other_queues
from broker.service.topics import Topics, TopicWatch, prepare_topics
from broker.values import now_ms

log = logging.getLogger("kq.instance")

STATUS_EVERY_S = 2.0
STOP_WAIT_S = 60.0  # a revoke waits this long for the shard's batch in flight
STOP_WITHIN_S = 20.0  # a clean stop of the process ends within this
STOP_STATUS_S = 2.0  # how long the last "stopped" status record may take to go out


@dataclass
class _Runner:
    service: Service
    thread: threading.Thread
    failure: BaseException | None = None


class Instance:
    def __init__(self, config: Config, bootstrap: str) -> None:
        self.config, self.bootstrap = config, bootstrap
        self.name = config.service.instance
        self.topics = Topics(config.service.topic_prefix)
        self.metrics = Metrics()
        self.owned: set[int] = set()  # what the group gives this instance now
        self.runners: dict[int, _Runner] = {}
        self.leaving: dict[int, _Runner] = {}  # told to stop, but still in a batch (slow Kafka)
        self.standbys: dict[int, Standby] = {}
        self.retiring: dict[int, Standby] = {}  # told to stop, still closing their copy
        self._stop = threading.Event()
        self._fenced_at: dict[int, float] = {}  # shards whose runner was fenced, and when
        self._deferred: set[int] = set()  # of those, shards another instance says it serves
        session_ms = config.service.session_timeout.ms
        self._frozen_s = session_ms / 2000  # the group loop quiet this long: it was frozen
        self._settle_s = 2 * clients.group_heartbeat_ms(session_ms) / 1000
        self._last_turn = time.monotonic()
        self._woke_at = float("-inf")
        self.ready = threading.Event()  # the group assigned, and each shard's service is up
        self.incarnation, self.started_ms = uuid.uuid4().hex, now_ms()
        self._duplicate = False  # another live process has this name: leave no trace
        self.unfinished: list[int] = []  # shards still in a batch when the stop gave up
        self.left_group = True  # False: its close still runs (in librdkafka) at the exit

    def stop(self) -> None:
        self._stop.set()

    # -- lifecycle -------------------------------------------------------------------------
    def run(self) -> None:
        svc = self.config.service
        extra = dict(svc.kafka)
        clients.check_reachable(self.bootstrap, extra)
        admin = clients.admin(self.bootstrap, extra)
        commands = [self.topics.commands,
                    *(self.topics.commands_of(p) for p in self.config.auth)]
        prepare_topics(admin, self.topics, commands, svc)
        topics = TopicWatch(admin, {self.topics.journal, *commands}, every_s=STATUS_EVERY_S)
        session_ms = svc.session_timeout.ms
        self.board = StatusBoard(self.bootstrap, extra, self.topics.instances, session_ms,
                                 me=self._status())
        try:
            refuse_other_queues(self.config, self.board, self.name, self.topics.prefix)
            self._check_name_before_joining()
        except ConfigError:
            self.board.close(0)
            raise
        self._group = clients.consumer(self.bootstrap, extra, **{
            "group.id": f"{self.topics.prefix}.service", "client.id": f"kq-{self.name}",
            **joining.member_settings(self.config, admin), "auto.offset.reset": "latest"})
        self._group.subscribe([self.topics.commands], on_assign=self._assigned,
                              on_revoke=self._revoked, on_lost=self._lost)
        log.info("instance %s joining group %s.service (%d shard(s), %s group protocol)",
                 self.name, self.topics.prefix, svc.shards, joining.protocol(self.config))
        last_status = 0.0
        self._last_turn = time.monotonic()  # the start-up's own waits are no freeze
        try:
            while not self._stop.is_set():
                self._turned()
                # heartbeats; assignments run the callbacks below
                self._check_group_answer(self._group.poll(0.1), admin)
                self._check_runners()
                self._serve_again_if_still_owned()
                topics.latest()  # raises if kq's topics are gone (Kafka lost its data)
                if time.monotonic() - last_status > STATUS_EVERY_S:
                    self._check_name_is_mine()
                    self._publish_status()
                    self._plan_standbys()
                    last_status = time.monotonic()
        finally:
            self._stop_all(time.monotonic() + STOP_WITHIN_S)

    def _check_group_answer(self, record: Any, admin: Any) -> None:
        """The group loop reads no records, but a coordinator's refusal comes as an error in
        their place: one that asking again cannot mend ends the start, naming the setting."""
        if record is None or record.error() is None:
            return
        why = joining.refusal(record.error(), self.config, admin)
        if why is not None:
            raise ConfigError(why)
        log.debug("instance %s: the group says %s", self.name, record.error().str())

    def _stop_all(self, deadline: float) -> None:
        """A clean stop, within `deadline` even with Kafka away (an orchestrator kills a
        process that takes longer: Kubernetes after 30 s by default). Every shard's batch in
        flight is finished side by side; a shard that cannot finish in time (Kafka not
        taking its batch) is left as a crash would leave it, which a restart recovers."""
        self.owned.clear()  # any later commit check of a straggler finds the shard gone
        runners, started = {**self.runners, **self.leaving}, time.monotonic()
        for runner in runners.values():
            runner.service.stop()
        for standby in self.standbys.values():
            standby.stop(0)  # told now, waited for below
        stuck = []
        for shard, runner in runners.items():
            runner.thread.join(max(0.0, deadline - time.monotonic()))
            if runner.thread.is_alive():
                stuck.append(shard)
        for standby in [*self.standbys.values(), *self.retiring.values()]:
            standby.stop(max(0.0, deadline - time.monotonic()))
        self.standbys.clear()
        self.retiring.clear()
        if stuck:
            # still in the group: the others take these shards after the session timeout,
            # when this process is surely gone (not while its batch may still go out)
            log.warning("instance %s: shard(s) %s still writing a batch after %.0f s (is Kafka "
                        "reachable?); stopping without it: a restart recovers them as after "
                        "a crash", self.name, ", ".join(map(str, stuck)), STOP_WITHIN_S)
            self.board.close(0)
            self.unfinished = stuck
            return
        self.runners.clear()
        self.leaving.clear()  # a failure to leave is said, not raised (a lost Kafka's place)
        self.left_group, why = joining.leave(
            self._group, max(1.0, deadline - time.monotonic() - STOP_STATUS_S))
        if why is not None:
            log.warning("instance %s: %s; its shards move after session_timeout", self.name, why)
        if not self._duplicate:  # the name's live holder goes on
            self.board.publish(self._status(stopped=True))
        self.board.close(min(STOP_STATUS_S, max(0.0, deadline - time.monotonic())))
        log.info("instance %s stopped in %.1f s", self.name, time.monotonic() - started)

    def _check_name_before_joining(self) -> None:
        """A live record of this name from another run, read at start, comes from a run
        that crashed just now, or from a second process under this name. On this host with
        that pid gone, it is the first: go on at once. Otherwise wait, before joining the
        group, for `_check_name_is_mine` to decide (a live run writes a record every
        STATUS_EVERY_S): a second process then stops without ever having held a shard."""
        prior = self.board.latest.get(self.name)
        if (prior is None or prior.incarnation == self.incarnation
                or not prior.live(now_ms(), self.board.timeout_ms)):
            return
        deadline = time.monotonic() + 3 * STATUS_EVERY_S + 1
        while time.monotonic() < deadline and not self._stop.is_set():
            if prior.host == socket.gethostname() and not kq_serve_runs(prior.pid):
                return
            self._check_name_is_mine()  # reads the records written since
            if self.board.latest[self.name].stopped:  # it was stopping as this one started
                return
            self._stop.wait(0.2)

    def _check_name_is_mine(self) -> None:
        """Two live processes under one instance name (a config copied to a second host
        with its `instance` line) would confuse standby placement and `kq instances`: the
        one started later stops, naming the other."""
        self.board.refresh()
        other = self.board.earlier_namesake()
        if other is None:
            return
        self._duplicate = True
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(other.started_ms / 1000))
        raise ConfigError(
            f"another kq serve already runs as instance {self.name!r} (host "
            f"{other.host or '?'}, pid {other.pid or '?'}, started {started}); each instance "
            "needs a name of its own ([service] instance, or KQ_INSTANCE). This one stops.")

    # -- the group's decisions -------------------------------------------------------------
    def _turned(self) -> None:
        """Called on every turn of the group loop (every 0.1 s) and as an assignment comes: a
        longer gap means this process was frozen (what the group said around it may be stale)."""
        now = time.monotonic()
        if now - self._last_turn > self._frozen_s:
            self._woke_at = now
        self._last_turn = now

    def _owns(self, shard: int) -> bool:
        """Whether the group gives this instance `shard`. Just after a freeze it first waits
        two heartbeat intervals: a woken member hears of its eviction at its first heartbeat,
        and a shard assigned before the freeze (and to another during it) must not have it
        write a takeover marker that would fence the rightful owner."""
        now = time.monotonic()
        if now - self._last_turn > self._frozen_s:
            self._woke_at = now  # woken, and the group loop has not turned since: it is next
        wait = self._woke_at + self._settle_s - now
        if wait > 0:
            self._stop.wait(wait)
        return shard in self.owned

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._turned()
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # nothing is read here: each shard reads its own
        if self._stop.is_set():  # come as the stop leaves the group: never served here
            return
        for tp in partitions:
            self.owned.add(tp.partition)
            self._start_runner(tp.partition)
        if not partitions and not self.runners:
            self.ready.set()  # an instance with nothing to own yet is up too

    def _revoked(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.owned.discard(tp.partition)
            self._stop_runner(tp.partition)

    def _lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        log.warning("instance %s lost shard(s) %s (its session expired)", self.name,
                    ", ".join(str(tp.partition) for tp in partitions))
        self._revoked(consumer, partitions)

    # -- shards served ---------------------------------------------------------------------
    def _start_runner(self, shard: int) -> None:
        self._fenced_at.pop(shard, None)
        self._deferred.discard(shard)
        if shard in self.runners:
            return
        old = self.leaving.get(shard)
        if old is not None and old.thread.is_alive():
            return  # it holds the shard's RocksDB: started once it ends (_check_runners)
        if self._retire_standby(shard):
            return  # its copy is where the service starts from: once closed (_check_runners)
        service = Service(self.config, self.bootstrap, shard=shard, metrics=self.metrics,
                          still_owner=lambda: self._owns(shard))
        runner = _Runner(service, threading.Thread(daemon=True, name=f"kq-shard-{shard}",
                                                   target=lambda: self._serve(runner)))
        self.runners[shard] = runner
        log.info("instance %s takes shard %d", self.name, shard)
        runner.thread.start()

    def _serve(self, runner: _Runner) -> None:
        try:
            runner.service.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main loop
            runner.failure = exc

    def _stop_runner(self, shard: int) -> None:
        runner = self.runners.pop(shard, None)
        if runner is None:
            return
        runner.service.stop()
        # Waited for in the group's callback, so the shard is not served twice; but a stop
        # of the process cuts the wait short (`_stop_all` then bounds it).
        give_up = time.monotonic() + STOP_WAIT_S
        while (runner.thread.is_alive() and time.monotonic() < give_up
               and not self._stop.is_set()):
            runner.thread.join(0.1)
            self._turned()  # a long wait here is no freeze (the other shards' commits go on)
        self.metrics.forget_queues(runner.service.engine.queues)
        if runner.thread.is_alive() and self._stop.is_set():
            self.leaving[shard] = runner
            return
        if runner.thread.is_alive():
            log.warning("instance %s: shard %d's service did not stop within %.0f s (Kafka "
                        "slow to take its batch?); it stops after that batch", self.name,
                        shard, STOP_WAIT_S)
            self.leaving[shard] = runner
            return
        log.info("instance %s released shard %d", self.name, shard)

    def _retire_standby(self, shard: int) -> bool:
        """Tell the shard's standby to close its copy; whether it is still closing. Never
        waited for: a rebalance callback that waits holds up the group and the stop."""
        if (standby := self.standbys.pop(shard, None)) is not None:
            standby.stop(0)
            self.retiring[shard] = standby
        return shard in self.retiring

    def _check_runners(self) -> None:
        for shard, standby in list(self.retiring.items()):
            if not standby.running:
                del self.retiring[shard]
                if shard in self.owned:  # assigned while its standby closed its copy
                    self._start_runner(shard)
        for shard, runner in list(self.leaving.items()):
            if not runner.thread.is_alive():
                del self.leaving[shard]
                log.info("instance %s released shard %d", self.name, shard)
                if shard in self.owned:  # given back meanwhile
                    self._start_runner(shard)
        for shard, runner in list(self.runners.items()):
            if runner.thread.is_alive():
                continue
            del self.runners[shard]
            self.metrics.forget_queues(runner.service.engine.queues)
            if isinstance(runner.failure, FencedError):
                log.warning("%s", runner.failure)  # the group will take it away too ...
                self._fenced_at[shard] = time.monotonic()
                continue
            if runner.failure is not None:
                raise runner.failure
        if self.runners and all(r.service.ready.is_set() for r in self.runners.values()):
            self.ready.set()

    def _serve_again_if_still_owned(self) -> None:
        """... unless it does not: a frozen owner may keep its membership and, once awake, be
        given its shard back (sticky assignment) while its runner stopped on another's marker.
        A session timeout later, with no revoke heard, the group's word stands: serve it.
        Not while another live instance says it serves the shard: then the marker was that
        owner's, and this instance's revoke is only late (a woken member may hear of it ten
        seconds on); serving again would fence the rightful owner with a late marker."""
        wait_s = self.config.service.session_timeout.ms / 1000
        for shard, fenced in list(self._fenced_at.items()):
            if shard not in self.owned:
                del self._fenced_at[shard]
                self._deferred.discard(shard)
            elif time.monotonic() - fenced > wait_s:
                other = self.board.serving_other_than(self.name, shard)
                if other is not None:
                    if shard not in self._deferred:
                        self._deferred.add(shard)
                        log.info("instance %s: the group has not taken shard %d back yet, "
                                 "but instance %s serves it: waiting for the group",
                                 self.name, shard, other)
                    continue
                del self._fenced_at[shard]
                log.warning("instance %s: the group still gives it shard %d: serving it again",
                            self.name, shard)
                self._start_runner(shard)

    # -- status and standbys ---------------------------------------------------------------
    def _status(self, stopped: bool = False) -> InstanceStatus:
        lag = {str(s): {"role": "owner", "records": r.service.lag()}
               for s, r in self.runners.items() if r.service.ready.is_set()}
        lag.update({str(s): {"role": "standby", "records": sb.lag}
                    for s, sb in self.standbys.items()})
        return InstanceStatus(self.name, sorted(self.runners), sorted(self.standbys), lag,
                              now_ms(), stopped, self.incarnation,
                              self.started_ms, socket.gethostname(), os.getpid(),
                              self.config.digest(), sorted(self.config.queues))

    def _publish_status(self) -> None:
        status = self._status()
        self.board.publish(status)
        self.metrics.shards_status(self.name, self.config.service.shards, status)

    def _plan_standbys(self) -> None:
        """Keep warm the shards whose owner this instance follows in name order."""
        if self.config.service.standby_replicas == 0:
            return
        wanted = self.board.standby_shards_of(self.name, self.config.service.shards)
        wanted -= set(self.runners)
        for shard in set(self.standbys) - wanted:
            self._retire_standby(shard)
        for shard in wanted - set(self.standbys) - set(self.retiring):
            log.info("instance %s keeps shard %d warm (standby)", self.name, shard)
            self.standbys[shard] = Standby(self.config, self.bootstrap, shard).start()
