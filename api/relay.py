"""Follows one job's stream from a cursor to its terminal entry.

`follow` yields the entries in order, and `KEEPALIVE` whenever `keepalive_s` passes with
nothing to send. It never hangs: a job not started by its deadline is ended here with
`queue_timeout`, a job whose keys vanished ends with `not_found`, and a Redis outage longer
than `outage_s` raises `StreamLost`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from api.hub import StreamHub
from api.jobs import JobStore
from contract import keys
from contract.entries import Entry, Failed, Started, is_terminal
from contract.keys import JobStatus

KEEPALIVE = None
READ_BATCH = 256


class StreamLost(Exception):
    """Redis could not be reached for too long to go on relaying."""


QUEUE_TIMEOUT = Failed(
    epoch=0,
    message="No worker started this request in time; try again later.",
    type="server_error",
    code="queue_timeout",
)
NOT_FOUND = Failed(
    epoch=0,
    message="This completion no longer exists.",
    type="invalid_request_error",
    code="not_found",
)


async def follow(
    store: JobStore,
    hub: StreamHub,
    completion_id: str,
    *,
    after: str = "0",
    keepalive_s: float,
    start_deadline: float | None = None,  # time.monotonic() by which a worker must start it
    outage_s: float = 10.0,
) -> AsyncIterator[tuple[str, Entry] | None]:
    cursor = after
    started = False
    last_sent = time.monotonic()
    outage_since: float | None = None
    async with hub.watch(keys.events(completion_id), cursor) as watch:
        while True:
            try:
                rows = await store.read(completion_id, cursor, count=READ_BATCH)
                if not rows and not await _alive(store, completion_id, started, start_deadline):
                    yield cursor, NOT_FOUND
                    return
                outage_since = None
            except RedisError as exc:
                now = time.monotonic()
                outage_since = outage_since or now
                if now - outage_since > outage_s:
                    raise StreamLost(str(exc)) from exc
                rows = []
            for entry_id, entry in rows:
                cursor = entry_id
                started = started or isinstance(entry, Started)
                last_sent = time.monotonic()
                yield entry_id, entry
                if is_terminal(entry):
                    return
            if len(rows) == READ_BATCH:
                continue  # more may be waiting already
            wait = keepalive_s - (time.monotonic() - last_sent)
            if outage_since is not None:
                wait = min(wait, 0.5)
            elif start_deadline is not None and not started:
                wait = min(wait, max(start_deadline - time.monotonic(), 0.0) + 0.05)
            if await watch.wait(cursor, wait):
                if not rows:  # woken, yet nothing was there: do not spin
                    await asyncio.sleep(0.05)
                continue
            if time.monotonic() - last_sent >= keepalive_s:
                last_sent = time.monotonic()
                yield KEEPALIVE


async def _alive(store: JobStore, completion_id: str, started: bool, deadline: float | None) -> bool:
    """False if nothing will ever be written to the job's stream again.

    A job past its start deadline is ended here with queue_timeout (END is idempotent and
    does nothing once a worker has started it); a job whose keys expired or were purged is
    gone."""
    if not started and deadline is not None and time.monotonic() > deadline:
        await store.end(completion_id, QUEUE_TIMEOUT, only_if_status=JobStatus.QUEUED)
        return True  # the terminal entry, if END wrote one, is read next
    return await store.status(completion_id) is not None
