"""The Responses endpoint's routes: the four every endpoint has (api/endpoints/routes.py), and
what the Responses API adds.

`previous_response_id` and `item_reference` are resolved from the stored responses. Cancel is
as OpenAI has it: background responses only, with the cancelled Response back. A `store: false`
response is found by no id. `GET …/{id}/input_items` lists a response's input items. Built-in
tools are left out or refused (HOSTED_TOOLS, api/endpoints/responses/offered.py). Reasoning is
sealed for the key and opened when it comes back (api/endpoints/responses/sealing.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.endpoints import images
from api.endpoints.body import Body
from api.endpoints.catalog import RESPONSES, Endpoint
from api.endpoints.responses.body import ResponsesRequest
from api.endpoints.responses.items import has_images, item_chars, message_chars, parse_reference, to_messages
from api.endpoints.responses.objects import ResponseObjects
from api.endpoints.responses.offered import refuse_hosted
from api.endpoints.responses.sealing import Seals, kept_secret
from api.endpoints.routes import EndpointRoutes
from api.http.errors import APIError, invalid
from api.http.paging import page
from api.http.parsing import unsupported
from api.jobs.state import JobState
from api.services import Services
from contract import errors
from contract.jobspec import Message
from contract.keys import JobField

# a running response stops at its worker's next token
CANCEL_WAIT_S = 5.0


@dataclass(frozen=True)
class StoredResponse:
    """A stored response, as a later request refers to it."""

    # its conversation: what it was asked (instructions left out)
    messages: list[Message]
    # its input items
    input: list[dict]
    # its output items
    output: list[dict]
    # its job's cache scope, where its images are kept
    scope: str = ""
    # the SHA-256 of each image of `messages`, in order
    images: tuple[str, ...] = ()
    # which of them were read at low detail
    low_detail: tuple[int, ...] = ()

    def conversation(self) -> list[Message]:
        return self.messages + to_messages(self.output)


def routes() -> list[Route]:
    responses = ResponsesRoutes(RESPONSES)
    return [
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{completion_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{completion_id}", responses.delete, methods=["DELETE"]),
        Route("/v1/responses/{completion_id}/cancel", responses.cancel, methods=["POST"]),
        Route("/v1/responses/{completion_id}/input_items", responses.input_items, methods=["GET"]),
    ]


class ResponsesRoutes(EndpointRoutes):
    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        # this process's, read once (`seals`)
        self._seals: Seals | None = None
        self._reading = anyio.Lock()

    async def seals(self, services: Services) -> Seals:
        """The seals of REASONING_SEAL_SECRETS, or of the secret kept in Redis (read once)."""
        async with self._reading:
            if self._seals is None:
                listed = services.settings.access.reasoning_seal_secrets
                self._seals = Seals(listed or [await kept_secret(services.redis)])
        return self._seals

    async def objects_of(self, services: Services, job: JobState) -> ResponseObjects:
        """Its objects, sealing its reasoning where the request asked."""
        objects = ResponseObjects.of(job)
        return ResponseObjects.of(job, (await self.seals(services)).seal) if objects.seals else objects

    def headers(self, body: Body) -> dict[str, str]:
        """`x-omitted-tools`: the built-in tools named and not offered (HOSTED_TOOLS=omit)."""
        assert isinstance(body, ResponsesRequest)
        left_out = body.omitted_tools()
        return {"x-omitted-tools": ",".join(left_out)} if left_out else {}

    async def job_named(self, services: Services, job_id: str, owner: str, param: str = "") -> JobState:
        """As for every endpoint, and a response created with `store: false` is not found."""
        job = await super().job_named(services, job_id, owner, param)
        if not ResponseObjects.of(job).stored:
            raise APIError(
                errors.NOT_FOUND, f"No response found with id '{job_id}'.", param=param or "response_id"
            )
        return job

    async def prepare(self, services: Services, body: Body, owner: str) -> None:
        """The conversation of `previous_response_id` and the items `item_reference`s name. Each
        earlier response is read once. They are refused (400) as soon as what they add to the prompt
        passes MAX_PROMPT_CHARS. A small request cannot expand into a huge one."""
        assert isinstance(body, ResponsesRequest)
        if services.settings.replies.hosted_tools == "refuse":
            refuse_hosted(body.tools or [])
        if body.sealed():
            await self._open(services, body, owner)
        limit = services.settings.limits.max_prompt_chars
        read: dict[str, StoredResponse] = {}
        history: list[Message] = []
        earlier_images: list[images.Image] = []
        chars = 0
        if body.previous_response_id is not None:
            rid = body.previous_response_id
            read[rid] = await self._earlier(services, rid, owner, "previous_response_id")
            history = read[rid].conversation()
            chars = sum(message_chars(m) for m in history)
            prior, limits = read[rid], services.settings.limits
            earlier_images = await images.kept(
                services.redis,
                prior.scope,
                list(prior.images),
                set(prior.low_detail),
                "previous_response_id",
                limits,
            )
        for at, part in body.image_parts():
            if part.file_id is not None:
                part._data = await images.file_bytes(services.redis, part.file_id, owner, f"{at}.file_id")
        referenced: dict[str, dict] = {}
        for ref in body.references():
            if ref not in referenced:
                referenced[ref] = await self._item(services, ref, owner, read)
                if has_images(referenced[ref]):
                    raise unsupported(
                        "input",
                        f"Item '{ref[:80]}' holds images: send the message again, not a reference to it.",
                    )
            chars += item_chars(referenced[ref])
            if chars > limit:
                raise invalid(
                    f"Invalid 'input': with its earlier responses and referenced items, the prompt is "
                    f"over {limit} characters long, the limit.",
                    param="input",
                    error=errors.STRING_TOO_LONG,
                )
        body.bind(history, referenced, earlier_images)

    async def _open(self, services: Services, body: ResponsesRequest, owner: str) -> None:
        """Open each sealed reasoning item for the key. An item this deployment did not seal for the
        key is a 400. It may be forged, changed, another key's, or of a secret no longer listed."""
        seals = await self.seals(services)
        for i, item in body.sealed():
            assert item.encrypted_content is not None
            text = seals.open(owner, item.encrypted_content)
            if text is None:
                raise APIError(
                    errors.INVALID_ENCRYPTED_CONTENT,
                    f"The encrypted content of input[{i}] could not be verified: it was not sealed "
                    "by this server for this API key.",
                    param=f"input[{i}].encrypted_content",
                )
            item.open_with(text)

    async def _earlier(self, services: Services, rid: str, owner: str, param: str) -> StoredResponse:
        job = await self.job_named(services, rid, owner, param)
        if not job.ended:
            raise invalid(f"Response '{rid}' has not finished yet.", param=param)
        spec, items = (
            await services.jobs.stored(rid, JobField.SPEC),
            await services.jobs.stored(rid, JobField.INPUT),
        )
        objects = ResponseObjects.of(job)
        rows = await services.jobs.whole(rid)
        output = objects.answer(rows).body["output"]
        asked = json.loads(spec) if spec else {}
        messages = [Message.from_dict(m) for m in asked.get("messages", ())]
        if objects.echo.get("instructions") is not None:
            # instructions do not carry over (as OpenAI has it)
            messages = messages[1:]
        return StoredResponse(
            messages,
            json.loads(items) if items else [],
            output,
            asked.get("cache_scope", ""),
            tuple(asked.get("images", ())),
            tuple(asked.get("low_detail", ())),
        )

    async def _item(
        self, services: Services, item_id: str, owner: str, read: dict[str, StoredResponse]
    ) -> dict:
        """The item an `item_reference` names: an input or output item of a stored response. `read`
        holds the responses this request has read already."""
        ref = parse_reference(item_id)
        if ref is not None and self.endpoint.owns(ref.response_id):
            if ref.response_id not in read:
                read[ref.response_id] = await self._earlier(services, ref.response_id, owner, "input")
            earlier = read[ref.response_id]
            for item in earlier.input if ref.input else earlier.output:
                if item.get("id") == item_id:
                    return item
        raise APIError(errors.NOT_FOUND, f"Item with id '{item_id[:80]}' not found.", param="input")

    async def cancel(self, request: Request) -> Response:
        """Stop a background response and answer with it, cancelled. One cancelled before is
        answered again. One that ended otherwise cannot be cancelled."""
        services, job = await self._job_of(request)
        objects = await self.objects_of(services, job)
        if not objects.background:
            raise invalid("Only responses created with background=true can be cancelled.")
        if not job.ended:
            await services.jobs.cancel(job.id)
            with anyio.move_on_after(CANCEL_WAIT_S):
                while (state := await services.jobs.state(job.id)) is not None and not state.ended:
                    await anyio.sleep(0.05)
        response = objects.answer(await services.jobs.whole(job.id)).body
        if (status := response["status"]) in ("completed", "failed", "incomplete"):
            raise invalid(f"Cannot cancel {'an' if status[0] in 'aeiou' else 'a'} {status} response.")
        return JSONResponse(response)

    async def input_items(self, request: Request) -> Response:
        """The response's input items, newest first unless `order=asc`. They come `limit` at a time
        (1 to 100, 20 by default), after the item `after`."""
        services, job = await self._job_of(request)
        items = json.loads(await services.jobs.stored(job.id, JobField.INPUT) or "[]")
        return page(request, items, max_limit=100, default_limit=20)
