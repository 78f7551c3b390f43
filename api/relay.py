"""Follows one job's stream from a cursor to its terminal entry.

`follow` yields the entries in order, in batches (all that were ready at once, so the
caller can send them in one write), and `KEEPALIVE` whenever `keepalive_s` passes with
nothing to send. It never hangs: a job not (re)started by its deadline is ended here
(`queue_timeout`, or `worker_lost` after a dead attempt), a job whose keys vanished ends with
`not_found`, and a Redis outage longer than `outage_s` raises `StreamLost`. Entries of every
attempt pass through as they are: fencing guarantees they form one continuous completion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from api.hub import StreamHub
from api.jobs import JobStore
from contract import keys
from contract.entries import Entry, Failed, is_terminal
from contract.keys import JobStatus

KEEPALIVE = None
READ_BATCH = 256


class StreamLost(Exception):
    """Redis could not be reached for too long to go on relaying."""


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
    inclusive: bool = False,  # also yield the entry `after` itself (a resume mid-entry)
    keepalive_s: float,
    outage_s: float = 10.0,
) -> AsyncIterator[list[tuple[str, Entry]] | None]:
    cursor = after
    late_at: float | None = None  # when a queued job passes its start deadline
    last_sent = time.monotonic()
    outage_since: float | None = None
    handed: list[tuple[str, Entry]] | None = None  # entries the hub read for us
    async with hub.watch(keys.events(completion_id), cursor) as watch:
        while True:
            try:
                if handed is not None:
                    rows, handed = handed, None
                else:
                    rows = await store.read(completion_id, cursor, count=READ_BATCH, inclusive=inclusive)
                if not rows:
                    alive, late_at = await _check(store, completion_id)
                    if not alive:
                        yield [("", NOT_FOUND)]
                        return
                outage_since = None
            except RedisError as exc:
                now = time.monotonic()
                outage_since = outage_since or now
                if now - outage_since > outage_s:
                    raise StreamLost(str(exc)) from exc
                rows = []
            if rows:
                for n, (_, entry) in enumerate(rows):
                    if is_terminal(entry):
                        rows = rows[: n + 1]
                        break
                cursor = rows[-1][0]
                inclusive = False
                last_sent = time.monotonic()
                yield rows
                if is_terminal(rows[-1][1]):
                    return
            if len(rows) == READ_BATCH:
                continue  # more may be waiting already
            wait = keepalive_s - (time.monotonic() - last_sent)
            if outage_since is not None:
                wait = min(wait, 0.5)
            elif late_at is not None:
                wait = min(wait, max(late_at - time.monotonic(), 0.0) + 0.05)
            got = await watch.wait(cursor, wait)
            if isinstance(got, list):
                handed = got
                continue
            if got:
                if not rows:  # woken, yet nothing was there: do not spin
                    await asyncio.sleep(0.05)
                continue
            if time.monotonic() - last_sent >= keepalive_s:
                last_sent = time.monotonic()
                yield KEEPALIVE


async def _check(store: JobStore, completion_id: str) -> tuple[bool, float | None]:
    """(False, _) if nothing will ever be written to the job's stream again (its keys expired
    or were purged); else (True, when a queued job passes its start deadline, if it is
    queued). A job already past it is ended here (END is idempotent)."""
    state = await store.state(completion_id)
    if state is None:
        return False, None
    if state.status != JobStatus.QUEUED or state.start_by_ms is None:
        return True, None
    left = state.start_by_ms / 1000 - time.time()
    if left < 0:
        await store.end_if_late(completion_id)  # the terminal entry is read next
        return True, None
    return True, time.monotonic() + left
