"""The work, done in an RQ job that is handed nothing but an event id.

The job reads the event from the inbox and, in ONE transaction:

1. asks the SDK's ordering rule (``ResourceOrdering``) what to do with it: the event goes
   into the ordering log (its id is the dedup key) and is compared with the file's
   high-water mark (``resource_version``; the timestamp when there is no version);
2. applies it to the ``files`` table only if it is newer (``Action.APPLY``);
3. marks the inbox row processed.

If anything raises, all three roll back together, and RQ's retry (or ``flask requeue``)
runs the job again from scratch. If the same event id is processed a second time (a
duplicate delivery arrived before the first job ran, a retried job, a requeue), the
ordering log already has it and the job does nothing: the work happens once per event id.

Jobs for one file may run in any order, on any number of workers: the ordering rule
decides by version, not by arrival, and a file's mark is locked while a job applies it.
"""

from __future__ import annotations

import logging

from flask import current_app

from promesa_receiver import ReceivedEvent

from .storage import Storage, files

log = logging.getLogger(__name__)

FILE_EVENT_PREFIX = "file."


def process_event(event_id: str) -> str:
    """Apply one received event; returns what happened (for logs): applied, stale,
    ignored, duplicate or missing."""
    storage: Storage = current_app.extensions["promesa_receiver"].storage
    body = storage.body_of(event_id)
    if body is None:  # only enqueued after the inbox row committed; a restored database could lose it
        log.warning("event %s is not in the inbox; nothing to do", event_id)
        return "missing"
    with storage.engine.begin() as conn:
        # The first statement is the ordering log's INSERT (a write): on SQLite concurrent
        # jobs queue for the write lock right here; on PostgreSQL the mark is row-locked.
        with storage.ordering.receiving(body, connection=conn) as decision:
            if decision.is_duplicate:
                outcome = "duplicate"
            elif not decision.should_apply:
                outcome = "stale"
            elif (decision.event.type or "").startswith(FILE_EVENT_PREFIX) and decision.resource_id:
                apply_file_change(conn, decision.event, storage)
                outcome = "applied"
            else:
                outcome = "ignored"  # persisted, but not an event this receiver acts on
            if outcome != "duplicate":
                storage.mark_processed(conn, event_id, outcome)
    log.info("event %s (%s %s v%s): %s", event_id, decision.event.type, decision.resource_id,
             decision.event.resource_version, outcome)
    return outcome


def apply_file_change(conn, event: ReceivedEvent, storage: Storage) -> None:
    """The state change itself, inside the job's transaction.

    Promesa's events are thin (ids and versions, no content): a real receiver would fetch
    the file's current state from the producer's API here and store it. This example
    records which version it now holds and which event told it so."""
    values = dict(resource_version=event.resource_version, event_id=event.event_id,
                  event_timestamp=event.payload.get("timestamp", ""), updated_at=storage.utcnow())
    updated = conn.execute(files.update().where(files.c.resource_id == event.resource_id).values(**values))
    if updated.rowcount == 0:
        conn.execute(files.insert().values(resource_id=event.resource_id, **values))
