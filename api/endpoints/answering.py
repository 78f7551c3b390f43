"""Answering with a job's stream, as SSE or as one response.

`SSEStream` streams the job's events. `collect` answers a client that does not stream. It
answers once, when the job has ended.

Every SSE stream ends with its endpoint's ending (`data: [DONE]` for the completion
endpoints). It does so whatever happened to the job, Redis or this code. A streaming client
that goes away cancels its job after the grace period. A job that runs in the background is
not cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from api.endpoints.chat.objects import Chunks
from api.endpoints.protocol import Answer, Events, LargeAnswers
from api.http.errors import APIError
from api.http.tracing import current as request_trace
from api.jobs.admission import StreamTicket
from api.metrics import StreamTiming
from api.services import Services
from api.streaming import sse
from api.streaming.relay import KEEPALIVE, StreamLost, follow
from contract import errors
from contract.entries import Entry, Failed, Finished, Rows, is_terminal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SSEStream:
    """One client's SSE stream of one job. It sends the opening, the job's events from where
    `events` reads, keep-alives and the ending."""

    services: Services
    events: Events
    job_id: str
    # its place among its key's open streams, given back at the end
    ticket: StreamTicket
    timing: StreamTiming
    # a client gone before the end cancels the job...
    cancel_on_disconnect: bool
    # ...unless another attached after its request came (ms since the epoch)
    arrived_ms: int
    # the owner whose token budget the job's end settles ("": none)
    settles: str = ""

    def response(self) -> StreamingResponse:
        return StreamingResponse(self._body(), media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)

    async def _body(self) -> AsyncIterator[bytes]:
        services, events = self.services, self.events
        ended = False
        end = None
        after, inclusive = events.read_from()
        services.metrics.streams_open.inc()
        # first: the first entry relayed (a new job's: its Started)
        trace, first = request_trace(), ""
        trace.relayed(after)
        # the trace has the first token's send
        told = False
        try:
            if opening := events.opening():
                yield opening
            try:
                async for item in follow(
                    services.jobs,
                    services.reader,
                    self.job_id,
                    after=after,
                    inclusive=inclusive,
                    keepalive_s=services.settings.lifetimes.keepalive_s,
                    outage_s=services.settings.lifetimes.outage_s,
                    resumes=services.resumes,
                ):
                    if item is KEEPALIVE:
                        yield events.keepalive()
                        continue
                    end = item[-1][1]
                    if trace.on and not first:
                        first = item[0][0]
                    out = events.encode(item)
                    self.timing.sent(out.contents)
                    if trace.on and not told and self.timing.ttft_s:
                        # once: where its time went (api/http/tracing.py)
                        told = True
                        trace.event("first token sent")
                    if out.data:
                        yield out.data
            except StreamLost as exc:
                log.warning("lost Redis while relaying %s: %s", self.job_id, exc)
                yield events.error(
                    errors.UNAVAILABLE, "The stream was interrupted: the queue is unreachable."
                )
            # a bug must not leave the client without an ending
            except Exception:
                log.exception("relay of %s failed", self.job_id)
                yield events.error(errors.INTERNAL)
            ended = True
            yield events.done()
            if self.settles and is_terminal(end):
                await settle(services, self.settles, self.job_id, end)
        finally:
            timing = self.timing
            trace.ended(end, first if timing.fresh else "", self.arrived_ms, timing.ttft_s)
            self.ticket.release()
            services.metrics.streams_open.dec()
            # gone: stop the job after the grace
            if not ended and self.cancel_on_disconnect:
                with anyio.CancelScope(shield=True):
                    await cancel_quietly(services, self.job_id, self.arrived_ms)


async def collect(
    request: Request, services: Services, chunks: Chunks, arrived_ms: int, settles: str = ""
) -> Response:
    """Wait for the job to end, then answer with the whole response. If `settles` names an owner,
    the answer waits until that owner's token budget is charged the job's usage. A client that goes
    away meanwhile cancels the job."""
    rows: Rows = []
    # the request's span (api/http/tracing.py)
    trace = request_trace()
    trace.relayed("0")
    try:
        async for item in follow(
            services.jobs,
            services.reader,
            chunks.id,
            keepalive_s=1.0,
            outage_s=services.settings.lifetimes.outage_s,
            resumes=services.resumes,
        ):
            if item is KEEPALIVE:
                if await request.is_disconnected():
                    await cancel_quietly(services, chunks.id, arrived_ms)
                    return Response(status_code=499)
                continue
            rows += item
            if is_terminal(end := rows[-1][1]):
                # an answer carrying vectors (embeddings) may be megabytes of JSON: written in pieces
                response = chunks.written(rows) if isinstance(chunks, LargeAnswers) else None
                if response is None:
                    size = len(end.vectors) if isinstance(end, Finished) else 0
                    response = await services.heavy.run_for(size, _answered, chunks, rows)
                if response is None:
                    continue
                if settles:
                    await settle(services, settles, chunks.id, end)
                trace.ended(end, rows[0][0], arrived_ms)
                return response
    except StreamLost:
        pass
    raise APIError(errors.UNAVAILABLE, "The queue is unreachable.")


def _answered(chunks: Chunks, rows: Rows) -> JSONResponse | None:
    answer = chunks.answer(rows)
    return None if answer is None else respond(answer)


def respond(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status)


async def settle(services: Services, owner: str, job_id: str, end: Entry) -> None:
    """Charge the owner what the ended job used in place of what it reserved. This is best effort. A
    reservation left is settled by the owner's next ADMIT that finds its budget short."""
    try:
        await services.jobs.owners.settle(owner, job_id, end if isinstance(end, Finished | Failed) else None)
    except RedisError as exc:
        log.warning("could not settle the tokens of %s: %s", job_id, exc)


async def cancel_quietly(services: Services, job_id: str, arrived_ms: int) -> None:
    try:
        await services.jobs.cancel(job_id, services.settings.lifetimes.cancel_grace_s, arrived_ms)
    except RedisError as exc:
        log.warning("could not cancel %s: %s", job_id, exc)
