"""POST /v1/chat/completions and POST /v1/completions.

Validate, enqueue one job, then relay its stream: as SSE chunks when `stream` is true,
otherwise as one response object assembled from the same entries. Every stream the client
receives ends with `data: [DONE]`, whatever happened to the job.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator

import anyio
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from api import admission, sse
from api.chunks import Chunks, completion_object
from api.cursor import OPENING, USAGE_SUFFIX, BadCursor, Cursor
from api.errors import WORKER_ERROR_STATUS, APIError, error_body
from api.relay import KEEPALIVE, StreamLost, follow
from api.requests import ChatRequest, CompletionRequest, enforce, parse
from api.services import Services
from contract import logs
from contract.entries import Delta, Failed, Finished
from contract.keys import JobStatus

log = logging.getLogger("tokenspool.api")

ID_PREFIX = {"chat": "chatcmpl-", "text": "cmpl-"}


def new_completion_id(kind: str) -> str:
    """Unguessable (144 random bits), and made only of characters RQ job ids allow."""
    return ID_PREFIX[kind] + secrets.token_urlsafe(18)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"The request body exceeds the limit of {limit} bytes.", code="request_too_large")


async def chat_completions(request: Request) -> Response:
    return await _complete(request, ChatRequest, "chat")


async def completions(request: Request) -> Response:
    return await _complete(request, CompletionRequest, "text")


async def _complete(request: Request, model, kind: str) -> Response:
    arrived = time.monotonic()
    services: Services = request.state.services
    settings = services.settings
    req = parse(model, await read_body(request, settings.max_body_bytes))
    enforce(req, settings.limits)
    owner = _owner(request)
    if req.streaming:
        admission.admit_stream(settings, owner, services.streams_by_owner[owner])
    await admission.admit_job(services.jobs, settings, owner)
    await admission.admit(services.jobs, settings, req.model)
    cid = new_completion_id(kind)
    logs.set_completion(cid)
    spec = req.to_spec(cid)
    created = int(time.time())
    detached = bool(req.background) or "respond-async" in request.headers.get("prefer", "")
    await services.jobs.submit(spec, created, owner=owner, include_usage=req.include_usage, detached=detached)
    log.info("enqueued %s for %s", cid, req.model)
    chunks = Chunks(kind, cid, created, req.model, include_usage=req.include_usage)
    if detached:
        return JSONResponse(_status_object(chunks, "queued"), status_code=202)
    if req.streaming:
        return _sse_response(services, chunks, owner, cursor=None, cancel_on_disconnect=True, arrived=arrived)
    return await _collect(request, services, chunks)


def _owner(request: Request) -> str:
    return getattr(request.state, "owner", "")


def _status_object(chunks: Chunks, status: str) -> dict:
    obj = "chat.completion" if chunks.kind == "chat" else "text_completion"
    return {
        "id": chunks.id,
        "object": obj,
        "created": chunks.created,
        "model": chunks.model,
        "status": status,
    }


def _sse_response(
    services: Services,
    chunks: Chunks,
    owner: str,
    cursor: Cursor | None,
    cancel_on_disconnect: bool,
    arrived: float | None = None,
) -> StreamingResponse:
    return StreamingResponse(
        _stream(services, chunks, owner, cursor, cancel_on_disconnect, arrived),
        media_type=sse.MEDIA_TYPE,
        headers=sse.HEADERS,
    )


async def _stream(
    services: Services,
    chunks: Chunks,
    owner: str,
    cursor: Cursor | None,
    cancel_on_disconnect: bool,
    arrived: float | None,
) -> AsyncIterator[bytes]:
    """The job's events after `cursor` (all of them without one), then live until the end.
    Every event but keep-alives and [DONE] carries its id (see api/cursor.py). `arrived`
    (a new request's arrival, monotonic) starts the time-to-first-token clock."""
    settings = services.settings
    metrics = services.metrics
    ttft, itl = metrics.ttft.labels(chunks.model), metrics.itl.labels(chunks.model)
    content = sse.ContentEvents(chunks.content)
    last_content = arrived  # None for a resumed stream: its first chunk is no TTFT
    seen_content = False
    ended = False
    resume_at = None if cursor is None or cursor.after_opening else cursor
    metrics.streams_open.inc()
    services.streams_by_owner[owner] += 1
    try:
        if cursor is None:
            opening = chunks.opening()
            if opening is not None:
                yield sse.event(opening, OPENING)
        try:
            async for item in follow(
                services.jobs,
                services.hub,
                chunks.id,
                after=resume_at.entry_id if resume_at else "0",
                inclusive=resume_at is not None and not resume_at.usage_sent,
                keepalive_s=settings.keepalive_s,
                outage_s=settings.outage_s,
            ):
                if item is KEEPALIVE:
                    yield sse.event(chunks.keepalive())
                    continue
                out: list[bytes] = []  # one write for all the entries that were ready
                for eid, entry in item:
                    sent = resume_at is not None and eid == resume_at.entry_id  # the client has it
                    if isinstance(entry, Delta):
                        if entry.text and not sent:
                            now = time.monotonic()
                            if last_content is not None:
                                (itl if seen_content else ttft).observe(now - last_content)
                            last_content, seen_content = now, True
                            out.append(content.event(entry.text, eid))
                    elif isinstance(entry, Finished):
                        if not sent:
                            out.append(sse.event(chunks.finish(entry.finish_reason), eid))
                        if chunks.include_usage:
                            usage = chunks.usage(entry.prompt_tokens, entry.completion_tokens)
                            out.append(sse.event(usage, eid + USAGE_SUFFIX))
                    elif isinstance(entry, Failed) and not sent:
                        error = error_body(entry.message, entry.type, entry.code, entry.param)
                        out.append(sse.event(error, eid or None))
                if out:
                    yield b"".join(out)
        except StreamLost as exc:
            log.warning("lost Redis while relaying %s: %s", chunks.id, exc)
            yield sse.event(
                error_body(
                    "The stream was interrupted: the queue is unreachable.",
                    "server_error",
                    "service_unavailable",
                    None,
                )
            )
        except Exception:  # a bug must not leave the client without an ending
            log.exception("relay of %s failed", chunks.id)
            yield sse.event(error_body("Internal server error.", "server_error", "internal_error", None))
        ended = True
        yield sse.DONE
    finally:
        metrics.streams_open.dec()
        services.streams_by_owner[owner] -= 1
        if services.streams_by_owner[owner] <= 0:
            del services.streams_by_owner[owner]
        if not ended and cancel_on_disconnect:  # the client went away: stop after the grace
            with anyio.CancelScope(shield=True):
                await _cancel_quietly(services, chunks.id)


async def _collect(request: Request, services: Services, chunks: Chunks) -> Response:
    text: list[str] = []
    try:
        async for item in follow(
            services.jobs,
            services.hub,
            chunks.id,
            keepalive_s=1.0,
            outage_s=services.settings.outage_s,
        ):
            if item is KEEPALIVE:
                if await request.is_disconnected():
                    await _cancel_quietly(services, chunks.id)
                    return Response(status_code=499)
                continue
            for _, entry in item:
                if isinstance(entry, Delta):
                    text.append(entry.text)
                elif isinstance(entry, Finished | Failed):
                    return _final_response(chunks, text, entry)
    except StreamLost:
        pass
    raise APIError(503, "The queue is unreachable.", "server_error", "service_unavailable")


def _final_response(chunks: Chunks, text: list[str], entry: Finished | Failed) -> JSONResponse:
    """The non-streamed answer, once the job's terminal entry is known."""
    if isinstance(entry, Failed):
        status = WORKER_ERROR_STATUS.get(entry.code, 500)
        return JSONResponse(
            error_body(entry.message, entry.type, entry.code, entry.param), status_code=status
        )
    obj = completion_object(
        chunks.kind,
        chunks.id,
        chunks.created,
        chunks.model,
        "".join(text),
        entry.finish_reason,
        entry.prompt_tokens,
        entry.completion_tokens,
    )
    return JSONResponse(obj)


async def _cancel_quietly(services: Services, completion_id: str) -> None:
    try:
        await services.jobs.cancel(completion_id, services.settings.cancel_grace_s)
    except RedisError as exc:
        log.warning("could not cancel %s: %s", completion_id, exc)


async def cancel_chat(request: Request) -> Response:
    return await _cancel(request, "chat")


async def cancel_completion(request: Request) -> Response:
    return await _cancel(request, "text")


async def _cancel(request: Request, kind: str) -> Response:
    """Stop a job: a queued one ends at once, a running one at its worker's next token.
    Cancelling an ended job changes nothing (the call is idempotent)."""
    services, cid, state = await _job_of(request, kind)
    if not state.ended:
        await services.jobs.cancel(cid)
        state = await services.jobs.state(cid) or state
    status = {JobStatus.DONE: "completed", JobStatus.FAILED: "failed"}.get(state.status, "cancelling")
    if state.ended and state.status == JobStatus.DONE and not state.attempts:
        status = "cancelled"  # ended before any worker started it
    obj = "chat.completion" if kind == "chat" else "text_completion"
    return JSONResponse({"id": cid, "object": obj, "status": status})


async def delete_chat(request: Request) -> Response:
    return await _purge(request, "chat")


async def delete_completion(request: Request) -> Response:
    return await _purge(request, "text")


async def _purge(request: Request, kind: str) -> Response:
    """DELETE: remove the completion's data (request, events, queue entries) now, rather
    than at the end of its retention; a running job stops at its next token. Afterwards the
    id is unknown (404)."""
    services, cid, state = await _job_of(request, kind)
    await services.jobs.purge(cid, state.attempts)
    log.info("purged on request")
    obj = "chat.completion.deleted" if kind == "chat" else "text_completion.deleted"
    return JSONResponse({"id": cid, "object": obj, "deleted": True})


async def retrieve_chat(request: Request) -> Response:
    return await _retrieve(request, "chat")


async def retrieve_completion(request: Request) -> Response:
    return await _retrieve(request, "text")


async def _job_of(request: Request, kind: str):
    """The job named in the path, if it exists, is of this kind and belongs to the caller's
    key; otherwise 404 (never 403: ids cannot be probed)."""
    services: Services = request.state.services
    cid = request.path_params["completion_id"]
    logs.set_completion(cid)
    state = await services.jobs.state(cid) if cid.startswith(ID_PREFIX[kind]) else None
    if state is None or state.kind != kind or not hmac.compare_digest(state.owner, _owner(request)):
        raise APIError(404, f"No completion found with id '{cid}'.", code="not_found", param="completion_id")
    return services, cid, state


async def _retrieve(request: Request, kind: str) -> Response:
    """GET: with ?stream=true, replay the events after Last-Event-ID (or ?starting_after)
    and follow live to the end; without, the completion object once it has finished."""
    services, cid, state = await _job_of(request, kind)
    chunks = Chunks(kind, cid, state.created, state.model, include_usage=state.include_usage)
    if request.query_params.get("stream", "").lower() in ("true", "1"):
        raw = request.headers.get("last-event-id") or request.query_params.get("starting_after")
        try:
            cursor = Cursor.parse(raw) if raw else None
        except BadCursor as exc:
            raise APIError(400, str(exc), code="invalid_cursor", param="starting_after") from None
        admission.admit_stream(services.settings, state.owner, services.streams_by_owner[state.owner])
        services.metrics.resumed.inc()
        if not state.detached:
            await services.jobs.keep(cid)  # the client is back: no disconnect cancel
        return _sse_response(services, chunks, state.owner, cursor, cancel_on_disconnect=not state.detached)
    text: list[str] = []
    for _, entry in await services.jobs.read(cid, "0", count=100_000):
        if isinstance(entry, Delta):
            text.append(entry.text)
        elif isinstance(entry, Finished | Failed):
            return _final_response(chunks, text, entry)
    status = "queued" if state.status == JobStatus.QUEUED else "in_progress"
    return JSONResponse(_status_object(chunks, status), status_code=202)
