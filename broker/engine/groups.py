"""Message groups (Qpid): one holder per group at a time, and a group's messages in order.

A part of `QueueState` (its base class). Each message's group is the value of the queue's
`group_key`, journaled with its arrival. Dispatch never looks at every available message:
it looks at each group's *head*, the first available message of the group in the queue's
delivery order. A free group's head (and every ungrouped message) waits in `group_free`; an
owned group's head waits in `group_owned[holder]`, where only that subscription looks. So a
subscription's next message is the first of two sorted indexes, whatever the depth, and a
busy group never stands in front of another one.

Who holds a group follows from the journaled transitions, so a replay rebuilds it:
  sticky  the subscription that leased a message of the group first holds it until that
          subscription ends (its UNSUBSCRIBED). Held groups outlive their messages, so the
          store keeps them too (`group_changes`, written by broker.state.layout).
  shared  the subscription holding unacknowledged messages of the group, while it does;
          ungrouped messages form the group `kq.no-group`. Rebuilt from the leased
          messages alone.

The indexes cover the available messages held in memory. Those paged out all come after
them (broker.engine.window), so a group's first message in memory is its first of all, and
a group with none in memory has its first among the paged-out ones, where dispatch looks
when nothing in memory is for a subscription with room (a window full of busy groups): a
bounded scan in delivery order (`group_scan`: where it goes on; `group_seen`: groups met
on the way, whose later messages are not their first).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Final

from mypy_extensions import trait
from sortedcontainers import SortedDict

from broker.config import QueueConfig
from broker.engine.message import Message
from broker.expr import Doc, compile_expression

NO_GROUP: Final = "kq.no-group"  # shared mode: the group of messages without one (Qpid's default)


def group_name(value: Any) -> str | None:
    """The group an expression's value names (None: no group). Equal values are one group
    whatever their representation: 7, 7.0 and the header string "7" alike."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if math.isnan(value):
            return None
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@trait  # a part of a class built of several (compiled with mypyc: see broker.compiled)
class MessageGroups:
    config: QueueConfig

    def _init_groups(self) -> None:
        key = self.config.group_key
        self.group_expr = compile_expression(key) if key else None
        self.group_shared = self.config.group_mode == "shared"
        self.group_free: SortedDict = SortedDict()  # order -> head of a free group, ungrouped
        self.group_owned: dict[str, SortedDict] = {}  # holder sub_id -> order -> head
        self.grouped: SortedDict = SortedDict()  # (group, order) -> available grouped message
        self.group_head: dict[str, Message] = {}  # group -> its first available message
        self.group_owner: dict[str, str] = {}  # group -> the sub_id holding it
        self.owner_groups: dict[str, set[str]] = {}  # sub_id -> the groups it holds
        self.group_taken: Counter[str] = Counter()  # shared: messages the holder holds
        # sticky: holders changed since the store last wrote them (None: freed)
        self.group_changes: dict[str, str | None] = {}
        self.group_scan: Any = None  # the order the scan of the pager reached (None: start)
        self.group_seen: set[str] = set()

    def group_value(self, doc: Doc | None) -> str | None:
        """A new message's group (journaled with its arrival)."""
        if self.group_expr is None or doc is None:
            return None
        return group_name(self.group_expr.evaluate(doc))

    def group_of(self, msg: Message) -> str | None:
        if msg.group is None and self.group_shared:
            return NO_GROUP
        return msg.group

    def holder_of(self, msg: Message) -> str | None:
        """The subscription that alone may take this message now (None: anyone may)."""
        group = self.group_of(msg)
        return None if group is None else self.group_owner.get(group)

    def _heads_of(self, group: str) -> SortedDict:
        owner = self.group_owner.get(group)
        if owner is None:
            return self.group_free
        heads = self.group_owned.get(owner)
        if heads is None:
            heads = self.group_owned[owner] = SortedDict()
        return heads

    def _drop_head(self, group: str, head: Message) -> None:
        heads = self._heads_of(group)
        heads.pop(head.order, None)
        if not heads and heads is not self.group_free:
            del self.group_owned[self.group_owner[group]]

    # -- the available messages ------------------------------------------------------------
    def _group_in(self, msg: Message) -> None:
        """The message became available."""
        group = self.group_of(msg)
        if group is None:
            self.group_free[msg.order] = msg
            return
        self.grouped[(group, msg.order)] = msg
        head = self.group_head.get(group)
        if head is None or msg.order < head.order:
            if head is not None:
                self._drop_head(group, head)
            self.group_head[group] = msg
            self._heads_of(group)[msg.order] = msg

    def _group_out(self, msg: Message) -> None:
        """The message is no longer available: its group's next one becomes the head."""
        group = self.group_of(msg)
        if group is None:
            self.group_free.pop(msg.order, None)
            return
        self.grouped.pop((group, msg.order), None)
        if self.group_head.get(group) is not msg:
            return
        self._drop_head(group, msg)
        del self.group_head[group]
        i = self.grouped.bisect_left((group, msg.order))
        if i < len(self.grouped):
            (next_group, order), following = self.grouped.peekitem(i)
            if next_group == group:
                self.group_head[group] = following
                self._heads_of(group)[order] = following

    # -- who holds a group -----------------------------------------------------------------
    def _set_holder(self, group: str, sub_id: str | None) -> None:
        if self.group_owner.get(group) == sub_id:
            return
        head = self.group_head.get(group)
        if head is not None:
            self._drop_head(group, head)
        old = self.group_owner.pop(group, None)
        if old is not None:
            groups = self.owner_groups[old]
            groups.discard(group)
            if not groups:
                del self.owner_groups[old]
        if sub_id is not None:
            self.group_owner[group] = sub_id
            self.owner_groups.setdefault(sub_id, set()).add(group)
        if head is not None:
            self._heads_of(group)[head.order] = head
        if not self.group_shared:
            self.group_changes[group] = sub_id

    def _group_leased(self, msg: Message) -> None:
        """The message was leased (or sent) to `msg.holder`: the group is its holder's."""
        group = self.group_of(msg)
        if group is None or msg.holder is None:
            return
        if self.group_shared:
            self.group_taken[group] += 1
        if group not in self.group_owner:
            self._set_holder(group, msg.holder)

    def _group_let_go(self, msg: Message) -> None:
        """The holder's lease of the message ended (acked, returned, removed)."""
        group = self.group_of(msg)
        if group is None or not self.group_shared:
            return
        left = self.group_taken[group] - 1
        if left > 0:
            self.group_taken[group] = left
            return
        self.group_taken.pop(group, None)
        self._set_holder(group, None)  # it may move now

    def _group_holder_ended(self, sub_id: str) -> None:
        """The subscription ended: the groups it held are free."""
        for group in sorted(self.owner_groups.get(sub_id, ())):
            self._set_holder(group, None)

    def restore_holders(self, leased: list[Message], stored: dict[str, str],
                        live: set[str]) -> None:
        """After a restart: the holders of the groups of leased messages, then the sticky
        holders the store kept. A stored holder whose subscription is gone is forgotten,
        in the store too."""
        for msg in leased:
            self._group_leased(msg)
        for group, sub_id in stored.items():
            if sub_id in live:
                self._set_holder(group, sub_id)
        self.group_changes = {group: None for group, sub_id in stored.items()
                              if sub_id not in live}
