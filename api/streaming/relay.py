"""Follows one job's stream from a cursor to its terminal entry.

`follow` yields the entries in order, in batches. A batch is all that were ready at once, so
the caller can send them in one write. It yields `KEEPALIVE` whenever `keepalive_s` passes
with nothing to send.

It never hangs. A job not (re)started by its deadline is ended here with `queue_timeout`.
After a dead attempt it ends with `worker_lost` instead, unless the pool can still run it
(api/cluster/resumes.py). A job whose keys vanished ends with `not_found`. A resume may send
a cursor after the end of a job that has ended. The stream then ends with `invalid_cursor`.
While the job runs, such a cursor is waited for. It may be an entry a replica has yet to
see. A Redis outage longer than `outage_s` raises `StreamLost`.

Entries of every attempt pass through as they are. Fencing guarantees they form one
continuous completion. One case breaks it. A failover took back entries already sent, with
the worker that would have written them again (docs/protocol.md, "Failover"). The next
attempt's `Started` then says it goes on from an entry before the last one sent. The stream
then ends with `stream_rolled_back`, rather than contradict what it sent.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.exceptions import RedisError

from api.cluster.resumes import Resumes
from api.jobs.store import JobStore
from api.streaming.cursor import past_end
from api.streaming.reader import Delivery, StreamReader, WakeReason, stream_id
from contract import errors, keys
from contract.entries import Rows, Started, is_terminal
from contract.keys import JobStatus

READ_BATCH = 256
# A job's hash missing this long is gone. Not at once: in a failover a connection may still
# read the replaced primary for a moment (docs/protocol.md, "Failover").
GONE_AFTER_S = 3.0
# A resume's cursor after every entry written is looked at again this often while its job
# runs: the job's end is written before the cursor, so no read of the stream wakes for it.
AHEAD_LOOK_S = 1.0


@dataclass(frozen=True)
class KeepAlive:
    """Nothing was sent for `keepalive_s`: the caller sends a keep-alive."""


KEEPALIVE = KeepAlive()


class StreamLost(Exception):
    """Redis could not be reached for too long to go on relaying."""


class _JobReader:
    """Reads one job's entries after a cursor, and knows when to look again unwoken.

    While Redis is away, it looks every 0.5 s, up to `outage_s`. When a queued job passes its
    start deadline, it looks, and the job is then ended here. While a client's cursor is after
    every entry written, it looks every `AHEAD_LOOK_S` until the job ends."""

    def __init__(
        self,
        store: JobStore,
        job_id: str,
        after: str,
        inclusive: bool,
        outage_s: float,
        resumes: Resumes | None = None,
    ):
        self._store = store
        self._resumes = resumes
        self._id = job_id
        self.cursor = after
        # also read the entry `after` itself (a resume mid-entry)
        self._inclusive = inclusive
        self._outage_s = outage_s
        self._outage_since: float | None = None
        # monotonic: when the queued job passes its deadline
        self._late_at: float | None = None
        # entries the reader read for us
        self._handed: Rows | None = None
        # monotonic: the job's hash was not found
        self._missing_since: float | None = None
        # the cursor is still the client's: it may be past every entry
        self._clients = after != "0"
        # the last read filled a batch: more may be waiting
        self.full = False

    def hand(self, rows: Rows) -> None:
        self._handed = rows

    async def read(self) -> Rows:
        """The next entries, up to and including a terminal one; [] if none yet."""
        try:
            if self._handed is not None:
                rows, self._handed = self._handed, None
            else:
                rows = await self._store.read(
                    self._id, self.cursor, count=READ_BATCH, inclusive=self._inclusive
                )
            if not rows:
                rows = await self._check()
            self.full = len(rows) == READ_BATCH
            self._outage_since = None
        except RedisError as exc:
            now = time.monotonic()
            self._outage_since = self._outage_since or now
            if now - self._outage_since > self._outage_s:
                raise StreamLost(str(exc)) from exc
            return []
        rows = self._unbroken(rows)
        for n, (_, entry) in enumerate(rows):
            if is_terminal(entry):
                rows = rows[: n + 1]
                break
        if rows:
            self.cursor = rows[-1][0]
            self._inclusive = False
            self._clients = False
        return rows

    def _unbroken(self, rows: Rows) -> Rows:
        """The rows up to an attempt that goes on from before what was already sent. Then
        `stream_rolled_back` comes instead of that attempt."""
        before = "0-0" if self.cursor == "0" else self.cursor
        for n, (entry_id, entry) in enumerate(rows):
            if (
                isinstance(entry, Started)
                and entry.after
                # the cursor's own entry: what came before is unknown
                and not (self._inclusive and n == 0)
                and stream_id(before) > stream_id(entry.after)
            ):
                return [*rows[:n], ("", errors.ROLLED_BACK.entry())]
            before = entry_id
        return rows

    async def _check(self) -> Rows:
        """Nothing new. Is the job gone (then its ending)? Did it end before the client's
        cursor, or is it queued past its deadline?"""
        state = await self._store.state(self._id)
        self._late_at = None
        if state is None:
            return self._missing()
        if self._clients and (ending := await self._ahead(state.ended)) is not None:
            return ending
        self._missing_since = None
        if state.status == JobStatus.QUEUED and state.start_by_ms is not None:
            left = state.start_by_ms / 1000 - time.time()
            if left < 0 and state.attempts and self._resumes and await self._resumes.may_wait(state.model):
                self._look_again(await self._store.wait_on(self._id))
            elif left < 0:
                # its terminal entry is read next
                await self._store.end_if_late(self._id)
            else:
                self._look_again(left)
        return []

    def _missing(self) -> Rows:
        """The job's keys are not there. It has gone (expired or purged). Or a failover is
        moving this connection to the server that has them. So `not_found` comes only after
        GONE_AFTER_S."""
        now = time.monotonic()
        self._missing_since = self._missing_since or now
        if now - self._missing_since >= GONE_AFTER_S:
            return [("", errors.NOT_FOUND.entry())]
        self._late_at = now + 0.5
        return []

    async def _ahead(self, ended: bool) -> Rows | None:
        """The client's cursor, and nothing after it. Past the last entry of an ended job,
        nothing will ever come. The stream then ends with `invalid_cursor`. The job's state
        was read first, so that entry is its terminal one. While the job runs, the cursor is
        waited for (docs/protocol.md, "Failover"). It is looked at again every AHEAD_LOOK_S.
        None: go on."""
        last = await self._store.last_id(self._id)
        newest, cursor = stream_id(last or "0-0"), stream_id(self.cursor)
        if last is not None and (newest > cursor or (self._inclusive and newest == cursor)):
            # written since the read: read again
            self._look_again(0.0)
            return None
        if not ended:
            self._look_again(AHEAD_LOOK_S)
            return None
        # the stream expired before the job's hash
        if last is None:
            return self._missing()
        return [("", errors.INVALID_CURSOR.entry(past_end(self.cursor, last)))]

    def _look_again(self, in_s: float) -> None:
        at = time.monotonic() + in_s
        self._late_at = at if self._late_at is None else min(self._late_at, at)

    def look_again_in(self) -> float:
        """Seconds until a read is due even if nothing wakes this stream."""
        if self._outage_since is not None:
            return 0.5
        if self._late_at is not None:
            return max(self._late_at - time.monotonic(), 0.0) + 0.05
        return math.inf


async def follow(
    store: JobStore,
    streams: StreamReader,
    job_id: str,
    *,
    after: str = "0",
    inclusive: bool = False,
    keepalive_s: float,
    outage_s: float = 10.0,
    resumes: Resumes | None = None,
) -> AsyncIterator[Rows | KeepAlive]:
    reader = _JobReader(store, job_id, after, inclusive, outage_s, resumes)
    async with streams.watch(keys.events(job_id), after) as watch:
        quiet_since = time.monotonic()
        while True:
            rows = await reader.read()
            if rows:
                quiet_since = time.monotonic()
                yield rows
                if is_terminal(rows[-1][1]):
                    return
                if reader.full:
                    continue
            wait = min(keepalive_s - (time.monotonic() - quiet_since), reader.look_again_in())
            wake = await watch.wait(reader.cursor, wait)
            if isinstance(wake, Delivery):
                reader.hand(wake.rows)
            elif wake is WakeReason.READY:
                # woken, yet nothing was there: do not spin
                if not rows:
                    await asyncio.sleep(0.05)
            elif time.monotonic() - quiet_since >= keepalive_s:
                quiet_since = time.monotonic()
                yield KEEPALIVE
