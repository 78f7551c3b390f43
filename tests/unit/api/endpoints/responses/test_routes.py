"""api/endpoints/responses/routes.py on a JobStore over fakeredis (real Lua): previous_response_id
and item_reference resolved from stored responses, within the owner's and MAX_PROMPT_CHARS'
bounds; sealed reasoning opened only for its key; built-in tools left out or refused; cancel
as OpenAI has it; and a response's input items, paged."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from api.endpoints.catalog import RESPONSES
from api.endpoints.responses.body import ResponsesRequest
from api.endpoints.responses.routes import ResponsesRoutes, routes
from api.endpoints.responses.sealing import Seals, kept_secret
from api.files.store import UNLIMITED, FileRecord, files_of
from api.http.errors import APIError
from api.http.parsing import parse
from api.jobs.store import JobStore
from api.settings import Access, Limits, Replies, Settings
from contract import entries, keys
from contract.entries import CANCELLED, Delta, Entry, Finished, Started
from contract.jobspec import Message
from contract.keys import JobField, JobStatus
from contract.media.images import png
from contract.prefixes import cache_scope
from contract.settings import Recovery
from tests.fake_servers import FakePair

OWNER, OTHER = "a" * 64, "b" * 64
RECOVERY = Recovery(job_ttl_s=600, retention_s=60)
MARKER = "<__media__>"  # contract/media/images.py: where an image sits in a text
DONE = Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=1)


class World:
    """One API process's view: its routes, and the services they read (Redis: fakeredis)."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.pair = FakePair()
        servers = self.pair.aio()
        self.streams = servers.streams
        self.services = SimpleNamespace(
            settings=settings or Settings(),
            redis=servers.queues,
            jobs=JobStore(servers, self.pair.sync(), queue_wait_s=60, recovery=RECOVERY),
        )
        self.routes = ResponsesRoutes(RESPONSES)

    async def ask(self, owner: str = OWNER, **body) -> ResponsesRequest:
        """A request, read and prepared as `create` prepares it."""
        request = parse(ResponsesRequest, json.dumps({"model": "m", **body}).encode())
        await self.routes.prepare(self.services, request, owner)  # type: ignore[arg-type]
        return request

    async def respond(self, *said: Entry, owner: str = OWNER, end: Finished | None = DONE, **body) -> str:
        """A response created (as `create` submits it), whose worker wrote `said` then `end`."""
        request = await self.ask(owner, **body)
        rid = RESPONSES.new_id()
        spec = request.to_spec(rid, self.services.settings.limits)
        await self.services.jobs.submit(
            spec,
            RESPONSES.name,
            1_700_000_000,
            owner=owner,
            detached=bool(request.background),
            fields=request.job_fields(rid),
        )
        for entry in said:
            await self.streams.xadd(keys.events(rid), entries.encode(entry))
        if end is not None:
            await self.services.jobs.end(rid, end)
        return rid

    def request(self, rid: str, owner: str = OWNER, query: bytes = b"") -> Request:
        scope = {
            "type": "http",
            "method": "GET",
            "path": f"/v1/responses/{rid}",
            "headers": [],
            "query_string": query,
            "state": {"services": self.services, "owner": owner},
            "path_params": {"completion_id": rid},
        }
        return Request(scope)


def said(text: str) -> tuple[Entry, Entry]:
    return Started(worker="w1", prompt_tokens=3), Delta(text=text, token_ids=(1,))


def refusal(make) -> APIError:
    async def go() -> None:
        await make(World())

    with pytest.raises(APIError) as caught:
        asyncio.run(go())
    return caught.value


def test_responses_are_created_retrieved_deleted_cancelled_and_listed_at_their_own_paths():
    got = {(r.path, m) for r in routes() for m in r.methods or () if m != "HEAD"}
    one = RESPONSES.path + "/{completion_id}"
    assert got == {
        (RESPONSES.path, "POST"),
        (one, "GET"),
        (one, "DELETE"),
        (one + "/cancel", "POST"),
        (one + "/input_items", "GET"),
    }


def test_a_previous_response_s_conversation_goes_first_without_its_instructions():
    async def go() -> tuple[Message, ...]:
        w = World()
        rid = await w.respond(*said("Hello!"), instructions="Be brief.", input="Hi")
        later = await w.ask(previous_response_id=rid, instructions="Be kind.", input="Again")
        return later.to_spec("resp_later", w.services.settings.limits).messages

    assert asyncio.run(go()) == (
        Message("system", "Be kind."),
        Message("user", "Hi"),
        Message("assistant", "Hello!"),
        Message("user", "Again"),
    )


@pytest.mark.parametrize(
    ("owner", "store", "asked"),
    [
        (OTHER, True, None),  # another key's
        (OWNER, False, None),  # store: false: no id finds it
        (OWNER, True, "resp_neverMade"),
        (OWNER, True, "chatcmpl-abc"),  # no response's id
    ],
)
def test_a_previous_response_that_is_not_the_key_s_stored_one_is_a_404(owner, store, asked):
    async def make(w: World) -> None:
        rid = await w.respond(*said("Hello!"), owner=owner, input="Hi", store=store)
        await w.ask(previous_response_id=asked or rid, input="Again")

    refused = refusal(make)
    assert (refused.status, refused.param) == (404, "previous_response_id")


def test_a_previous_response_still_running_is_a_400():
    async def make(w: World) -> None:
        rid = await w.respond(*said("Hel"), end=None, input="Hi")
        await w.ask(previous_response_id=rid, input="Again")

    refused = refusal(make)
    assert (refused.status, refused.param) == (400, "previous_response_id")
    assert "has not finished yet" in refused.message


def test_an_item_reference_finds_an_input_or_output_item_of_a_stored_response():
    async def go() -> tuple[Message, ...]:
        w = World()
        rid = await w.respond(*said("Sunny."), input=[{"role": "user", "content": "Weather?"}])
        rest = rid.removeprefix("resp_")
        refs = [
            {"type": "item_reference", "id": f"msg_{rest}_in0"},
            {"type": "item_reference", "id": f"msg_{rest}_0"},
        ]
        later = await w.ask(input=[*refs, {"role": "user", "content": "And tomorrow?"}])
        return later.to_spec("resp_later", w.services.settings.limits).messages

    assert asyncio.run(go()) == (
        Message("user", "Weather?"),
        Message("assistant", "Sunny."),
        Message("user", "And tomorrow?"),
    )


@pytest.mark.parametrize(
    ("item", "owner"),
    [
        ("msg_{rest}_in7", OWNER),  # no such input item
        ("msg_{rest}_3", OWNER),  # no such output item
        ("fc_{rest}_0", OWNER),  # output item 0 is a message, not this call
        ("msg_{rest}_in0", OTHER),  # another key's response
        ("msg_nothing", OWNER),  # no id this server makes
    ],
)
def test_an_item_reference_that_finds_nothing_of_the_key_s_is_a_404(item, owner):
    async def make(w: World) -> None:
        rid = await w.respond(*said("Sunny."), owner=owner, input="Weather?")
        ref = item.format(rest=rid.removeprefix("resp_"))
        await w.ask(input=[{"type": "item_reference", "id": ref}, {"role": "user", "content": "x"}])

    refused = refusal(make)
    assert (refused.status, refused.param) == (404, "input")


def test_references_cannot_expand_a_small_request_past_max_prompt_chars():
    """The same item named again counts again: each is one more copy in the prompt."""

    async def go(limit: int, copies: int) -> int:
        w = World(Settings(limits=Limits(max_prompt_chars=limit)))
        rid = await w.respond(*said("ok"), input="x" * 40)
        ref = {"type": "item_reference", "id": f"msg_{rid.removeprefix('resp_')}_in0"}
        later = await w.ask(input=[ref] * copies)
        return len(later.to_spec("resp_later", w.services.settings.limits).messages)

    assert asyncio.run(go(limit=120, copies=3)) == 3  # 120 characters: at the limit
    with pytest.raises(APIError) as caught:
        asyncio.run(go(limit=119, copies=3))
    refused = caught.value
    assert (refused.status, refused.param, refused.code) == (400, "input", "string_above_max_length")


def test_earlier_turns_count_toward_the_limit_that_references_are_held_to():
    async def go(copies: int) -> int:
        w = World(Settings(limits=Limits(max_prompt_chars=50)))
        rid = await w.respond(*said("y" * 30), input="x" * 10)
        ref = {"type": "item_reference", "id": f"msg_{rid.removeprefix('resp_')}_in0"}
        later = await w.ask(previous_response_id=rid, input=[ref] * copies)
        return len(later.to_spec("resp_later", w.services.settings.limits).messages)

    assert asyncio.run(go(1)) == 3  # 10 + 30 before it, 10 with it: 50
    with pytest.raises(APIError) as caught:
        asyncio.run(go(2))  # 60
    assert caught.value.code == "string_above_max_length"


def image_part(data: bytes) -> dict:
    return {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(data).decode()}


def test_a_reference_to_a_message_that_holds_images_is_refused():
    async def make(w: World) -> None:
        content = [{"type": "input_text", "text": "What is it?"}, image_part(png(2, 2))]
        rid = await w.respond(*said("A dot."), input=[{"role": "user", "content": content}])
        ref = {"type": "item_reference", "id": f"msg_{rid.removeprefix('resp_')}_in0"}
        await w.ask(input=[ref, {"role": "user", "content": "x"}])

    refused = refusal(make)
    assert (refused.status, refused.param, refused.code) == (400, "input", "unsupported_parameter")
    assert "holds images" in refused.message


def test_a_previous_response_s_images_are_read_back_while_kept_and_a_400_after():
    data = png(3, 3, seed=4)
    sha = hashlib.sha256(data).hexdigest()

    async def go(kept: bool) -> tuple[tuple[str, ...], str]:
        w = World()
        content = [{"type": "input_text", "text": "See "}, image_part(data)]
        rid = await w.respond(*said("A square."), input=[{"role": "user", "content": content}])
        if kept:  # as `create` stores an image its job sent (api/endpoints/images.py)
            await w.services.redis.set(keys.image(cache_scope(OWNER), sha), data)
        later = await w.ask(previous_response_id=rid, input="Again")
        spec = later.to_spec("resp_later", w.services.settings.limits)
        return spec.images, spec.messages[0].content

    assert asyncio.run(go(kept=True)) == ((sha,), f"See {MARKER}")
    with pytest.raises(APIError) as caught:
        asyncio.run(go(kept=False))
    assert (caught.value.status, caught.value.param) == (400, "previous_response_id")
    assert "no longer kept" in caught.value.message


@pytest.mark.parametrize(
    ("purpose", "asker", "found"),
    [("vision", OWNER, True), ("user_data", OWNER, True), ("batch", OWNER, False), ("vision", OTHER, False)],
)
def test_an_image_file_is_read_for_the_key_that_uploaded_it_for_images(purpose, asker, found):
    data = png(2, 3, seed=7)
    record = FileRecord("file-abc123", OWNER, "dot.png", purpose, len(data), 1, 2**31)

    async def go() -> tuple[str, ...]:
        w = World()
        await files_of(w.services.redis).put(record, data, UNLIMITED)  # type: ignore[arg-type]
        content = [
            {"type": "input_text", "text": "What is it?"},
            {"type": "input_image", "file_id": record.id},
        ]
        later = await w.ask(asker, input=[{"role": "user", "content": content}])
        return later.to_spec("resp_later", w.services.settings.limits).images

    if found:
        assert asyncio.run(go()) == (hashlib.sha256(data).hexdigest(),)
        return
    with pytest.raises(APIError) as caught:
        asyncio.run(go())
    assert (caught.value.status, caught.value.param) == (404, "input[0].content[1].file_id")


def sealed_turns(sealed: str) -> list[dict]:
    return [
        {"role": "user", "content": "Is 17 prime?"},
        {"type": "reasoning", "summary": [], "encrypted_content": sealed},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "And 21?"},
    ]


def test_sealed_reasoning_opens_for_the_key_it_was_sealed_for_only():
    secret = "s" * 32
    settings = Settings(access=Access(reasoning_seal_secrets=(secret,)))

    async def go(owner: str) -> tuple[Message, ...]:
        w = World(settings)
        later = await w.ask(owner, input=sealed_turns(Seals([secret]).seal(OWNER, "17 has no divisor.")))
        return later.to_spec("resp_later", settings.limits).messages

    assert asyncio.run(go(OWNER))[1] == Message("assistant", "Yes.", reasoning="17 has no divisor.")
    with pytest.raises(APIError) as caught:
        asyncio.run(go(OTHER))
    refused = caught.value
    assert (refused.status, refused.param, refused.code) == (
        400,
        "input[1].encrypted_content",
        "invalid_encrypted_content",
    )


def test_without_listed_secrets_reasoning_is_sealed_with_the_one_kept_in_redis():
    async def go(sealed_by: str) -> tuple[Message, ...]:
        w = World()
        kept = await kept_secret(w.services.redis)  # type: ignore[arg-type]
        secret = kept if sealed_by == "redis" else "t" * 32
        later = await w.ask(input=sealed_turns(Seals([secret]).seal(OWNER, "thought")))
        return later.to_spec("resp_later", w.services.settings.limits).messages

    assert asyncio.run(go("redis"))[1].reasoning == "thought"
    with pytest.raises(APIError) as caught:
        asyncio.run(go("another deployment"))
    assert caught.value.code == "invalid_encrypted_content"


TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    {"type": "web_search"},
    {"type": "mcp", "server_label": "x"},
]


def test_built_in_tools_are_left_out_and_named_in_a_header_or_refused():
    async def go(hosted: str) -> dict[str, str]:
        w = World(Settings(replies=Replies(hosted_tools=hosted)))
        return w.routes.headers(await w.ask(input="x", tools=TOOLS))

    assert asyncio.run(go("omit")) == {"x-omitted-tools": "web_search,mcp"}
    with pytest.raises(APIError) as caught:
        asyncio.run(go("refuse"))
    assert (caught.value.status, caught.value.param) == (400, "tools[1].type")
    assert World().routes.headers(parse(ResponsesRequest, b'{"model": "m", "input": "x"}')) == {}


def cancel(background: bool, *said_: Entry, end: Finished | None = None, running: bool = False):
    """Cancel a response; (its status after, or the 400's message)."""

    async def go() -> str:
        w = World()
        rid = await w.respond(*said_, end=end, input="Hi", background=background)
        if running:  # a worker holds it; it stops at its next token
            await w.streams.hset(keys.job(rid), JobField.STATUS, JobStatus.RUNNING)

            async def worker_stops() -> None:
                await asyncio.sleep(0.02)
                await w.services.jobs.end(
                    rid, Finished(finish_reason=CANCELLED, prompt_tokens=3, completion_tokens=1)
                )

            stopping = asyncio.create_task(worker_stops())
        try:
            answer = json.loads((await w.routes.cancel(w.request(rid))).body)
        except APIError as exc:
            return exc.message
        if running:
            await stopping
        return answer["status"] + ":" + "".join(p["text"] for o in answer["output"] for p in o["content"])

    return asyncio.run(go())


def test_a_queued_background_response_is_cancelled_at_once_and_answered_cancelled():
    assert cancel(True) == "cancelled:"


def test_a_running_background_response_is_answered_once_its_worker_has_stopped():
    assert cancel(True, *said("Hel"), running=True) == "cancelled:Hel"


def test_only_a_background_response_not_yet_ended_otherwise_can_be_cancelled():
    assert cancel(False) == "Only responses created with background=true can be cancelled."
    assert cancel(True, *said("Hi!"), end=DONE) == "Cannot cancel a completed response."
    cut = Finished(finish_reason="length", prompt_tokens=3, completion_tokens=1)
    assert cancel(True, *said("Hi"), end=cut) == "Cannot cancel an incomplete response."
    stopped = Finished(finish_reason=CANCELLED, prompt_tokens=3, completion_tokens=0)
    assert cancel(True, end=stopped) == "cancelled:"  # again: the same answer


def test_input_items_are_listed_newest_first_or_in_order_a_page_at_a_time():
    sent = [{"role": "user", "content": f"turn {i}"} for i in range(5)]

    async def go(query: str, owner: str = OWNER, store: bool = True) -> dict:
        """The page `query` asks for, `{rest}` in it the response's id without its prefix."""
        w = World()
        rid = await w.respond(*said("ok"), input=sent, store=store)
        asked = query.format(rest=rid.removeprefix("resp_")).encode()
        return json.loads((await w.routes.input_items(w.request(rid, owner, asked))).body)

    def texts(page: dict) -> list[str]:
        return [item["content"][0]["text"] for item in page["data"]]

    newest = asyncio.run(go(""))
    assert texts(newest) == [f"turn {i}" for i in (4, 3, 2, 1, 0)] and newest["has_more"] is False
    assert newest["first_id"].endswith("_in4") and newest["last_id"].endswith("_in0")
    first = asyncio.run(go("order=asc&limit=2"))
    assert texts(first) == ["turn 0", "turn 1"] and first["has_more"] is True
    rest = asyncio.run(go("order=asc&limit=2&after=msg_{rest}_in3"))
    assert texts(rest) == ["turn 4"] and rest["has_more"] is False
    for bad, param in (("limit=101", "limit"), ("limit=0", "limit"), ("order=up", "order")):
        with pytest.raises(APIError) as caught:
            asyncio.run(go(bad))
        assert caught.value.param == param
    for owner, store in ((OTHER, True), (OWNER, False)):  # another key's, or one no id finds
        with pytest.raises(APIError) as caught:
            asyncio.run(go("", owner, store))
        assert caught.value.status == 404
