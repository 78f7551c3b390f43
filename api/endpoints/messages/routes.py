"""The Messages API's routes: the four every endpoint has (api/endpoints/routes.py), and
`POST /v1/messages/count_tokens`.

A count is exact. Only a worker holds the model's tokenizer and chat template: the API never
loads a model. So a count is a small job, one of no tokens. A worker of the model tokenizes it
and ends it at once, without generating. It waits in the model's queue like any job. With the
pool scaled to zero, it waits for a worker as long as QUEUE_WAIT_SECONDS allows. Then it is
answered `overloaded_error` (529), which the SDKs retry.
"""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.endpoints.answering import collect
from api.endpoints.catalog import MESSAGES
from api.endpoints.messages.body import MessagesRequest
from api.endpoints.messages.objects import MessageObjects, failure
from api.endpoints.protocol import Answer
from api.endpoints.routes import EndpointRoutes, JobRequest
from api.http.auth import allowed, request_grant, request_owner
from api.http.parsing import parse
from api.http.reading import read_json
from api.jobs.owners import now_ms
from api.services import Services
from api.settings import Limits
from contract.entries import Failed, Finished, Rows, Started
from contract.jobspec import JobSpec


class CountRequest(MessagesRequest):
    """What a message would be made of, without what only generating takes."""

    max_tokens: None = None  # type: ignore[assignment]
    stream: None = None  # type: ignore[assignment]
    stop_sequences: None = None  # type: ignore[assignment]
    temperature: None = None  # type: ignore[assignment]
    top_p: None = None  # type: ignore[assignment]
    top_k: None = None  # type: ignore[assignment]
    metadata: None = None  # type: ignore[assignment]
    service_tier: None = None  # type: ignore[assignment]

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        return dataclasses.replace(super().to_spec(job_id, limits), max_tokens=0)

    def wanted_tokens(self) -> tuple[int | None, str]:
        return None, "max_tokens"


@dataclasses.dataclass(frozen=True)
class CountObjects(MessageObjects):
    """A count job's answer: `{"input_tokens": N}` once a worker has tokenized its prompt. Where its
    clear_tool_uses edit cleared any, it also has the count before. That count is Anthropic's
    `context_management.original_input_tokens`."""

    def answer(self, rows: Rows) -> Answer | None:
        started: Started | None = None
        for _, entry in rows:
            started = entry if isinstance(entry, Started) else started
            if isinstance(entry, Failed):
                return Answer(*failure(entry))
            if isinstance(entry, Finished):
                counted: dict = {"input_tokens": entry.prompt_tokens}
                if started and started.cleared_tool_uses:
                    original = entry.prompt_tokens + started.cleared_input_tokens
                    counted["context_management"] = {"original_input_tokens": original}
                return Answer(200, counted)
        return None


def routes() -> list[Route]:
    messages = MessagesRoutes(MESSAGES)
    return [
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/v1/messages", messages.create, methods=["POST"]),
        Route("/v1/messages/{completion_id}", messages.retrieve, methods=["GET"]),
        Route("/v1/messages/{completion_id}", messages.delete, methods=["DELETE"]),
        Route("/v1/messages/{completion_id}/cancel", messages.cancel, methods=["POST"]),
    ]


class MessagesRoutes(EndpointRoutes):
    async def count_tokens(self, request: Request) -> Response:
        arrived_ms = now_ms()
        services: Services = request.state.services
        settings = services.settings
        raw = await read_json(request, settings.limits.max_body_bytes, settings.limits.request_read_s)
        body = await services.heavy.run_for(len(raw), parse, CountRequest, raw)
        owner = request_owner(request)
        # a count is a job of the key's tier
        allowed(request_grant(request), body.priority)
        body.enforce(settings.limits)
        ask = JobRequest(request, services, body, owner, None, len(raw))
        made = await self._job_for(ask)
        response = await collect(request, services, CountObjects.of(made.job), arrived_ms)
        response.headers.update(made.headers(ask))
        return response
