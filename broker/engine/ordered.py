"""`OrderIndex`: a queue's available messages by delivery order (`Message.order` -> message),
and those each subscriber's filter matches.

A queue takes from the front of this index and adds at the back, a few times per message, so
it is on every message's path. sortedcontainers' SortedDict did the job as interpreted Python
(about a tenth of the service's CPU per message); this is the part of it a queue uses, in a
module mypyc compiles. The same layout: the keys in sorted sublists of at most 2 * LOAD, each
sublist's keys all below the next one's, with the largest key of each beside them for
bisection, and the values in a dict. Adding at the back appends to the last sublist, taking
from the front deletes from the first: each moves at most one sublist's pointers.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator
from typing import Any, Final

# Sublists of up to twice this many keys: with 20,000 keys, taking from the front and adding at
# the back measured 15-25% faster than with sortedcontainers' default of 1,000.
LOAD: Final = 300

_MISSING: Final[Any] = object()


class OrderIndex:
    """Keys (orders, which compare as tuples do) to values, iterated in key order."""

    def __init__(self, load: int = LOAD) -> None:
        self._load = load
        self._lists: list[list[Any]] = []  # the keys, sorted, in sublists
        self._maxes: list[Any] = []  # the last key of each sublist
        self._values: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self._values)

    def __bool__(self) -> bool:
        return bool(self._values)

    def __contains__(self, key: Any) -> bool:
        return key in self._values

    def __getitem__(self, key: Any) -> Any:
        return self._values[key]

    def get(self, key: Any, default: Any = None) -> Any:
        return self._values.get(key, default)

    def __setitem__(self, key: Any, value: Any) -> None:
        values = self._values
        if key in values:
            values[key] = value
            return
        values[key] = value
        maxes, lists = self._maxes, self._lists
        if not maxes:
            lists.append([key])
            maxes.append(key)
            return
        if maxes[-1] < key:  # the usual case: a new message, after every other
            i = len(maxes) - 1
            lists[i].append(key)
            maxes[i] = key
        else:
            i = bisect_left(maxes, key)
            insort(lists[i], key)
        if len(lists[i]) > 2 * self._load:
            self._split(i)

    def _split(self, i: int) -> None:
        keys = self._lists[i]
        half = keys[self._load:]
        del keys[self._load:]
        self._lists.insert(i + 1, half)
        self._maxes[i] = keys[-1]
        self._maxes.insert(i + 1, half[-1])

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        """Remove `key` and give its value; `default` when it is not there (KeyError
        without one)."""
        value = self._values.pop(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        lists, maxes = self._lists, self._maxes
        first = lists[0]
        if first[0] == key:  # the usual case: the front
            i, j = 0, 0
        else:
            i = bisect_left(maxes, key)
            j = bisect_left(lists[i], key)
        keys = lists[i]
        del keys[j]
        if not keys:
            del lists[i]
            del maxes[i]
        elif j == len(keys):
            maxes[i] = keys[-1]
        return value

    def peekitem(self, index: int = -1) -> tuple[Any, Any]:
        """The (key, value) at position `index` (negative: from the end); IndexError when
        there is none."""
        key = self._key_at(index)
        return key, self._values[key]

    def _key_at(self, index: int) -> Any:
        lists = self._lists
        if index < 0:
            back = -index
            for n in range(len(lists) - 1, -1, -1):
                keys = lists[n]
                if back <= len(keys):
                    return keys[len(keys) - back]
                back -= len(keys)
        else:
            for keys in lists:
                if index < len(keys):
                    return keys[index]
                index -= len(keys)
        raise IndexError("OrderIndex index out of range")

    def __iter__(self) -> Iterator[Any]:
        for keys in self._lists:
            yield from keys

    def keys_after(self, key: Any) -> Iterator[Any]:
        """The keys above `key`, in order."""
        return self._keys_beyond(key, bisect_right)

    def keys_from(self, key: Any) -> Iterator[Any]:
        """The keys at or above `key`, in order."""
        return self._keys_beyond(key, bisect_left)

    def _keys_beyond(self, key: Any, find: Callable[[list[Any], Any], int]) -> Iterator[Any]:
        lists = self._lists
        i = find(self._maxes, key)
        if i == len(lists):
            return
        keys = lists[i]
        yield from keys[find(keys, key):]
        for n in range(i + 1, len(lists)):
            yield from lists[n]

    def values(self) -> Iterator[Any]:
        values = self._values
        for keys in self._lists:
            for key in keys:
                yield values[key]

    def values_reversed(self) -> Iterator[Any]:
        values, lists = self._values, self._lists
        for n in range(len(lists) - 1, -1, -1):
            keys = lists[n]
            for j in range(len(keys) - 1, -1, -1):
                yield values[keys[j]]

    def first_values(self, count: int) -> list[Any]:
        """The values of the first `count` keys (fewer when there are fewer)."""
        out: list[Any] = []
        values = self._values
        for keys in self._lists:
            for key in keys:
                if len(out) >= count:
                    return out
                out.append(values[key])
        return out

    def items(self) -> Iterator[tuple[Any, Any]]:
        values = self._values
        for keys in self._lists:
            for key in keys:
                yield key, values[key]
