"""What ingest's routing read returned, kept in each web process, and written against only while it holds.

The read (the token's team, the subscriptions that may want a type, the type's declaration) is a large
share of a single-event request's database work and of its web process's CPU, and its answer
changes only when someone edits subscriptions, tokens, the catalog or a team. On PostgreSQL every such
change moves one number, the routing generation, when it commits (migration b4e8d2a6c9f3). The read
returns the generation with its rows; a request answered from what was kept writes with
`WHERE EXISTS (... generation = <the kept one>)`, and when that stores nothing the routing has changed:
the request runs again on a fresh read (ingest.ingest_many). A request that writes nothing (duplicates)
is read afresh too. So a revoked token, a new subscription or a new version takes effect for the next
write exactly as it did when every request read, and a refusal (401, a schema the data fails) is never
given from what was kept: it is read again first.

What is kept is ingest's answer as made (ingest.Route): each subscription's payload filter already compiled,
so a filter is compiled once per generation and process, never per request or event; an edit to a filter is a
change to subscriptions like any other, and moves the generation.

Only ingest's own autocommit path (ingest.autocommit) keeps anything; elsewhere every request reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable

from sqlalchemy import literal_column

# The generation as a column of the routing read (the table has one row).
GENERATION = literal_column("(SELECT generation FROM promesa_routing_generation)").label("routing_generation")
# The write's condition: the generation is still the one its routing was read at.
STILL_CURRENT = " WHERE EXISTS (SELECT FROM promesa_routing_generation WHERE generation = %b::bigint)"

# Producers (tokens) x event types x asked versions kept per process; the least recently used goes first.
MAX_ENTRIES = 4096


class ReadAgain(Exception):
    """What was kept cannot answer this request: the routing has changed since (`changed`), or nothing the
    request writes would check it (every event a duplicate). Read the routing afresh and run it again."""

    def __init__(self, changed: bool):
        super().__init__("the routing changed" if changed else "the kept routing is not checked by a write")
        self.changed = changed


class RoutingCache:
    """One process's kept routing answers, all of one generation (a newer one empties it)."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._generation: int | None = None
        self._max = max_entries
        self._lock = threading.Lock()  # gunicorn's threads share it

    def get(self, key: Hashable) -> tuple[Any, int] | None:
        with self._lock:
            answer = self._entries.get(key)
            if answer is None:
                return None
            self._entries.move_to_end(key)
            return answer, self._generation

    def put(self, key: Hashable, answer: Any, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                if self._generation is not None and generation < self._generation:
                    return  # read before a change another request has already seen: keep the newer
                self._entries.clear()
                self._generation = generation
            self._entries[key] = answer
            self._entries.move_to_end(key)
            if len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def forget(self, generation: int) -> None:
        """What was kept at `generation` is stale."""
        with self._lock:
            if self._generation == generation:
                self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Lookup:
    """One request's use of the cache: whether its routing came from it, and at which generation."""

    def __init__(self, cache: RoutingCache | None):
        self.cache = cache
        self.generation: int | None = None  # the kept generation this request's routing came from
        self.writing = False  # past its checks: a refusal now is about the write, not the routing

    def kept(self, key: Hashable) -> Any | None:
        if self.cache is None:
            return None
        found = self.cache.get(key)
        if found is None:
            return None
        answer, self.generation = found
        return answer

    def keep(self, key: Hashable, answer: Any, generation: int | None) -> None:
        if self.cache is not None and generation is not None:
            self.cache.put(key, answer, generation)

    def stale(self) -> None:
        if self.cache is not None and self.generation is not None:
            self.cache.forget(self.generation)
