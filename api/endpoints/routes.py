"""The handlers every endpoint that creates jobs shares (api/endpoints/catalog.py).

They are create, retrieve or resume, cancel, delete. Each endpoint's folder puts them on its
paths, in its own routes.py (api/endpoints/chat/routes.py).

Create validates, admits and enqueues one job, then answers. A background job is answered at
once with its status. Otherwise the answer is the job's SSE stream, or the whole response once
the job has ended.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.endpoints import images
from api.endpoints.answering import SSEStream, collect, respond, settle
from api.endpoints.body import Body
from api.endpoints.catalog import Endpoint
from api.endpoints.protocol import Events, Objects
from api.http import ratelimits
from api.http.auth import allowed, key_id, request_grant, request_owner
from api.http.errors import APIError, invalid, speaks_anthropic
from api.http.parsing import parse
from api.http.reading import read_json
from api.http.tracing import trace_of
from api.jobs import reservation
from api.jobs.admission import ModelLimits, StreamTicket
from api.jobs.owners import (
    Idempotency,
    IdempotencyConflict,
    MinuteUsage,
    OwnerLimit,
    OwnerRate,
    Quota,
    now_ms,
)
from api.jobs.state import JobState, Submission
from api.metrics import StreamTiming
from api.services import Services
from api.settings import Replies
from api.streaming.cursor import BadCursor
from contract import errors, keys, logs
from contract.entries import is_terminal
from contract.jobspec import JobSpec
from contract.keys import JobStatus
from contract.prefixes import cache_scope

log = logging.getLogger(__name__)


def _idempotency(request: Request, endpoint: Endpoint, owner: str, raw: bytes) -> Idempotency | None:
    """The request's Idempotency-Key (IETF httpapi draft), scoped to its owner. A retry must carry
    the same request: the same JSON body, to the same endpoint."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not 1 <= len(key) <= 255 or not key.isascii() or not key.isprintable():
        raise invalid("Idempotency-Key must be 1 to 255 printable ASCII characters.", param="Idempotency-Key")
    canonical = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))
    return Idempotency(
        key=keys.idempotency(owner, hashlib.sha256(key.encode()).hexdigest()),
        digest=hashlib.sha256(f"{endpoint.name} {canonical}".encode()).hexdigest(),
    )


def _sse(
    services: Services,
    events: Events,
    job: JobState,
    ticket: StreamTicket,
    timing: StreamTiming,
    arrived_ms: int,
    settles: str,
) -> Response:
    """A job's events as an SSE response. A client gone cancels a job it is attached to."""
    stream = SSEStream(
        services,
        events,
        job.id,
        ticket,
        timing,
        cancel_on_disconnect=not job.detached,
        arrived_ms=arrived_ms,
        settles=settles,
    )
    return stream.response()


def settles(job: JobState, budgets: ratelimits.Budgets) -> str:
    """The owner whose token budget the job's end settles, when a request reads it. The request is
    of a key with these `budgets`. The owner is the job's, when the key has a token budget. "" means
    nothing to settle."""
    return job.owner if job.owner and budgets.tokens_per_minute else ""


def _streaming(request: Request) -> bool:
    return request.query_params.get("stream", "").lower() in ("true", "1")


@dataclass(frozen=True)
class JobRequest:
    """One request to create a job, read and checked: what making its job needs."""

    request: Request
    services: Services
    body: Body
    owner: str
    idempotency: Idempotency | None
    # the body's bytes, counted against the key's byte budget
    size: int

    @property
    def anthropic(self) -> bool:
        """The request speaks Anthropic's API: its errors and headers are Anthropic's."""
        return speaks_anthropic(self.request.scope)

    @functools.cached_property
    def budgets(self) -> ratelimits.Budgets:
        """What the request's key may use a minute."""
        return self.services.admission.budgets(request_grant(self.request))


@dataclass(frozen=True)
class Creation:
    """The job a create request got, and what its key has used this minute. The use is None for a
    retry's job: the first request counted it."""

    job: JobState
    retried: bool
    spent: MinuteUsage | None = None

    def headers(self, ask: JobRequest) -> dict[str, str]:
        """The rate-limit headers for the key's budgets (none for a retry or without keys)."""
        if self.spent is None or not ask.owner:
            return {}
        s = self.spent
        return ratelimits.headers(ask.budgets, s.minute, s.requests, s.tokens, ask.anthropic)


class EndpointRoutes:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def create(self, request: Request) -> Response:
        arrived, arrived_ms = time.monotonic(), now_ms()
        services: Services = request.state.services
        settings = services.settings
        raw = await read_json(request, settings.limits.max_body_bytes, settings.limits.request_read_s)
        body = await services.heavy.run_for(len(raw), parse, self.endpoint.body, raw)
        owner = request_owner(request)
        allowed(request_grant(request), body.priority)
        await self.prepare(services, body, owner)
        body.enforce(settings.limits)
        idempotency = await services.heavy.run_for(len(raw), _idempotency, request, self.endpoint, owner, raw)
        ticket = services.admission.stream(owner) if body.streaming else None
        try:
            ask = JobRequest(request, services, body, owner, idempotency, len(raw))
            made = await self._job_for(ask)
            job = made.job
            logs.set_job(job.id)
            # when this client attached to the job
            attached_ms = arrived_ms
            if made.retried:
                log.info("a retry (Idempotency-Key) of %s", job.id)
                # the first request's disconnect cancels nothing
                if not job.detached:
                    attached_ms = await services.jobs.keep(job.id)
            objects = await self.objects_of(services, job)
            if ticket is None:
                if job.detached:
                    response: Response = respond(objects.pending(queued=job.status == JobStatus.QUEUED))
                else:
                    response = await collect(
                        request, services, objects, arrived_ms, settles(job, ask.budgets)
                    )
                    await self.answered(services, job.id, ask, response, attached_ms)
            else:
                timing = StreamTiming(services.metrics, job.model, arrived)
                # a body that streams has a stream
                assert self.endpoint.events is not None
                # a retry gets the whole stream from the start
                events = self.endpoint.events(objects, None)
                response = _sse(services, events, job, ticket, timing, arrived_ms, settles(job, ask.budgets))
            response.headers.update(made.headers(ask) | self.headers(body))
            return response
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise

    async def prepare(self, services: Services, body: Body, owner: str) -> None:
        """What an endpoint must look up before its body becomes a job (nothing, here)."""

    async def objects_of(self, services: Services, job: JobState) -> Objects:
        """The job's objects, as this endpoint answers with them."""
        return self.endpoint.objects_of(job)

    def headers(self, body: Body) -> dict[str, str]:
        """What an endpoint's create response says in headers of its own (nothing, here)."""
        return {}

    async def answered(
        self, services: Services, job_id: str, ask: JobRequest, response: Response, attached_ms: int
    ) -> None:
        """What an endpoint does once a client waiting for a job's whole answer has its `response`.
        A 499 means the client went away first. The client attached to the job at `attached_ms`.
        Here it does nothing: the job is kept for its retention, to be fetched or resumed again."""

    async def _job_for(self, ask: JobRequest) -> Creation:
        """The job this request makes, or the one its earlier attempt made. The request is then a
        retry with the same Idempotency-Key."""
        services, body = ask.services, ask.body
        quota = Quota()
        try:
            if ask.idempotency is not None and (earlier := await services.jobs.idempotent(ask.idempotency)):
                await self._joined(services, ask.request, earlier)
                return Creation(earlier, retried=True)
            job_id = self.endpoint.new_id()
            logs.set_job(job_id)
            trace = trace_of(ask.request.scope)
            trace.open(self.endpoint.name, body.model, job_id, tier=body.priority, key_id=key_id(ask.owner))
            limits = await services.admission.model(body.pool, job_id, body.context_chars())
            try:
                await images.fetch_remote(body, limits.vision, services.settings.limits)
                spec = await services.heavy.run_for(ask.size, body.to_spec, job_id, services.settings.limits)
                if spec.images:
                    scope, ttl = cache_scope(ask.owner, body.cache_salt), services.settings.recovery.job_ttl_s
                    await images.store(services.redis, body, scope, limits.vision, ttl)
                # the attempts' spans join the request's trace (contract/tracing/)
                if trace.on:
                    spec = replace(spec, trace_context=trace.carried())
                quota = self._quota(ask, spec, limits)
                submitted = await self._submit(ask, spec, quota)
                trace.event("enqueued")
            # the enqueue takes the place; anything else gives it back
            finally:
                await services.admission.release(body.pool, job_id)
        except OwnerLimit as exc:
            raise services.admission.jobs(exc.unfinished) from None
        except OwnerRate as exc:
            grant = request_grant(ask.request)
            raise services.admission.rate(
                exc.what, grant, exc.requests, exc.tokens, quota.tokens, ask.anthropic
            ) from None
        except IdempotencyConflict:
            raise APIError(errors.IDEMPOTENCY_CONFLICT, param="Idempotency-Key") from None
        return Creation(submitted.job, not submitted.new, submitted.spent if submitted.new else None)

    def _quota(self, ask: JobRequest, spec: JobSpec, limits: ModelLimits) -> Quota:
        """The key's limits, and the tokens the job reserves. It reserves the most its prompt can be
        (api/jobs/reservation.py) and its `max_tokens`. Together they are no more than a worker's
        context holds. A job that generates nothing (a count) reserves nothing."""
        # an image's tokens bounded by what its workers announce (contract.keys.worker_vision)
        prompt = limits.cap(
            reservation.prompt_tokens(spec, limits.overhead) + len(spec.images) * limits.vision
        )
        return Quota(
            unfinished_jobs=ask.services.settings.quotas.max_jobs_per_key,
            budgets=ask.budgets,
            request_bytes=ask.size,
            tokens=limits.cap(prompt + spec.max_tokens) if spec.max_tokens else 0,
            prompt_tokens=prompt,
        )

    async def _submit(self, ask: JobRequest, spec: JobSpec, quota: Quota) -> Submission:
        """Record and enqueue a new job. A request racing with its own retry gets the job the first
        of them made."""
        services, body = ask.services, ask.body
        settings = services.settings
        job_id = spec.id
        submitted = await services.jobs.submit(
            spec,
            self.endpoint.name,
            int(time.time()),
            owner=ask.owner,
            include_usage=body.include_usage,
            # a job whose answer cannot be fetched later (no stream: embeddings) is always waited for
            detached=self.endpoint.events is not None
            and (bool(body.background) or "respond-async" in ask.request.headers.get("prefer", "")),
            idempotency=ask.idempotency,
            fields=body.job_fields(job_id) | reasoning_field(settings.replies),
            cache_salt=body.cache_salt,
            quota=quota,
        )
        if submitted.new:
            services.metrics.created.labels(self.endpoint.name).inc()
            log.info("enqueued %s for %s", job_id, body.pool)
        return submitted

    async def retrieve(self, request: Request) -> Response:
        """With ?stream=true, replay the events after Last-Event-ID (or ?starting_after) and follow
        live to the end. Without it, answer with the response once the job has ended (202 and its
        status before). A cursor after the last event of an ended job is refused: nothing will ever
        come after it. A cursor after the last event of a running job is waited for
        (api/streaming/relay.py)."""
        arrived_ms = now_ms()
        services, job = await self._job_of(request)
        objects = await self.objects_of(services, job)
        settled_by = settles(job, services.admission.budgets(request_grant(request)))
        if _streaming(request):
            raw = request.headers.get("last-event-id") or request.query_params.get("starting_after")
            try:
                # its routes are only those of streams
                assert self.endpoint.events is not None
                events = self.endpoint.events(objects, raw)
                if raw and job.ended:
                    events.check_within(await services.jobs.whole(job.id))
            except BadCursor as exc:
                raise APIError(errors.INVALID_CURSOR, str(exc), param="starting_after") from None
            ticket = services.admission.stream(job.owner)
            try:
                services.metrics.resumed.inc()
                if not job.detached:
                    # the client is back: no disconnect cancel
                    await services.jobs.keep(job.id)
                timing = StreamTiming(services.metrics, job.model, arrived=None)
                return _sse(services, events, job, ticket, timing, arrived_ms, settled_by)
            except BaseException:
                ticket.release()
                raise
        rows = await services.jobs.whole(job.id)
        answer = objects.answer(rows)
        if answer is not None:
            if settled_by and rows and is_terminal(rows[-1][1]):
                await settle(services, settled_by, job.id, rows[-1][1])
            return respond(answer)
        return respond(objects.pending(queued=job.status == JobStatus.QUEUED))

    async def cancel(self, request: Request) -> Response:
        """Stop a job. A queued one ends at once, a running one at its worker's next token.
        Cancelling an ended job changes nothing (the call is idempotent)."""
        services, job = await self._job_of(request)
        if not job.ended:
            await services.jobs.cancel(job.id)
            job = await services.jobs.state(job.id) or job
        return JSONResponse(self.endpoint.objects_of(job).cancelled(job.status))

    async def delete(self, request: Request) -> Response:
        """Remove the job's data now rather than at the end of its retention. The data is its
        request, events and queue entries. A running job stops at its next token. Afterwards the id
        is unknown."""
        services, job = await self._job_of(request)
        await services.jobs.purge(job.id)
        log.info("purged on request")
        return JSONResponse(self.endpoint.objects_of(job).deleted())

    async def _joined(self, services: Services, request: Request, job: JobState) -> None:
        """Tracing on, the request's span joins the trace of the request that made `job`. The
        request is a resume, a retry or a cancel. It joins while the job keeps its spec."""
        trace = trace_of(request.scope)
        if trace.on:
            made = json.loads(await services.jobs.stored(job.id, keys.JobField.SPEC) or "{}")
            trace.open(self.endpoint.name, job.model, job.id, made.get("trace_context", ""))

    async def _job_of(self, request: Request) -> tuple[Services, JobState]:
        """The job named in the path. It must exist and belong to this endpoint and to the caller's
        key. Otherwise a 404, never a 403: ids cannot be probed."""
        services: Services = request.state.services
        job = await self.job_named(services, request.path_params["completion_id"], request_owner(request))
        # its span in the job's trace
        await self._joined(services, request, job)
        return services, job

    async def job_named(self, services: Services, job_id: str, owner: str, param: str = "") -> JobState:
        """The job `job_id`. It must exist and belong to this endpoint and to `owner`. Otherwise a
        404 naming `param`, never a 403: ids cannot be probed."""
        noun = self.endpoint.noun
        param = param or f"{noun}_id"
        # never echoed nor logged: it is the client's own text
        if not self.endpoint.owns(job_id):
            raise APIError(errors.NOT_FOUND, f"No {noun} found with that id.", param=param)
        logs.set_job(job_id)
        job = await services.jobs.state(job_id)
        if job is None or job.endpoint != self.endpoint.name or not hmac.compare_digest(job.owner, owner):
            raise APIError(errors.NOT_FOUND, f"No {noun} found with id '{job_id}'.", param=param)
        return job


def reasoning_field(replies: Replies) -> dict[str, str]:
    """The job's field for a reasoning model's thinking, when not the default. It is recorded, so
    that every replica says it the same whatever its REASONING_FIELD."""
    if replies.reasoning_field == "reasoning_content":
        return {}
    return {keys.JobField.REASONING: replies.reasoning_field}
