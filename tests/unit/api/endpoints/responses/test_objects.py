"""A Response and its events from a job's entries: the same entries always give the same
numbered events, whichever path reads them, and every ending has its shape."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from api.endpoints.responses.events import KEEPALIVE, response_events
from api.endpoints.responses.objects import ResponseObjects
from api.endpoints.responses.sealing import Seals
from api.jobs.state import JobState
from api.streaming.cursor import BadCursor
from contract import errors
from contract.entries import CallPart, Delta, Finished, Started
from contract.keys import JobStatus
from devstack.sse_contract import check_responses_stream

OBJECTS = ResponseObjects("resp_abc", 1700000000, "m", {"background": True, "instructions": "Be brief."})
EVENT = TypeAdapter(ResponseStreamEvent)


def text(t: str) -> Delta:
    return Delta(text=t, token_ids=(1,))


def rows(*entries) -> list:
    return [(f"17000000{n:05d}-0", e) for n, e in enumerate(entries, start=1)]


STARTED = Started(worker="w", prompt_tokens=5)
DONE = Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=2)


def stream(objects: ResponseObjects, entries: list, after: str | None = None) -> bytes:
    events = response_events(objects, after)
    out = events.opening()
    for row in entries:
        out += events.encode([row]).data
    return out + events.done()


def test_every_event_and_the_response_validate_against_the_sdk_types():
    entries = rows(STARTED, text("Hel"), text("lo"), DONE)
    parsed = check_responses_stream(stream(OBJECTS, entries))
    kinds = [e["type"] for e in parsed.events]
    assert kinds == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)
    final = Response.model_validate(parsed.terminal["response"], strict=True)
    assert (
        final.output_text == "Hello" and final.usage.total_tokens == 7 and final.instructions == "Be brief."
    )
    assert OBJECTS.answer(entries).body == parsed.terminal["response"]


def test_resuming_anywhere_gives_the_rest_with_the_same_numbers():
    entries = rows(STARTED, text("a"), text("b"), Started(worker="w2", prompt_tokens=5), text("c"), DONE)
    whole = check_responses_stream(stream(OBJECTS, entries)).events
    assert sum(e["type"] == "response.in_progress" for e in whole) == 1  # a crash's second attempt
    for after in range(len(whole)):
        rest = check_responses_stream(
            stream(OBJECTS, entries, str(after)), starting_after=after, complete=False
        ).events
        assert rest == whole[after + 1 :]


def test_thinking_is_a_reasoning_item_before_the_message_in_the_sdk_s_shapes():
    thought = Delta(text="", token_ids=(1,), reasoning="2 < 3")
    both = Delta(text="Yes", token_ids=(2,), reasoning=", so")
    done = Finished(finish_reason="stop", prompt_tokens=5, completion_tokens=3, reasoning_tokens=2)
    entries = rows(STARTED, thought, both, text("."), done)
    parsed = check_responses_stream(stream(OBJECTS, entries))
    kinds = [e["type"] for e in parsed.events[3:]]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)
    final = Response.model_validate(parsed.terminal["response"], strict=True)
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and reasoning.content is not None and message.type == "message"
    assert [c.text for c in reasoning.content] == ["2 < 3, so"] and reasoning.id.startswith("rs_")
    assert final.output_text == "Yes." and final.usage is not None
    assert final.usage.output_tokens_details.reasoning_tokens == 2
    assert OBJECTS.answer(entries).body == parsed.terminal["response"]
    encoded = response_events(OBJECTS, None).encode(entries)
    assert encoded.contents == 4  # two of thinking, two of text: each counts as output relayed
    for after in range(len(parsed.events)):  # resumed anywhere: the rest, the same
        rest = check_responses_stream(
            stream(OBJECTS, entries, str(after)), starting_after=after, complete=False
        )
        assert rest.events == parsed.events[after + 1 :]


def test_a_tool_call_after_text_closes_the_message_first():
    calls = Delta(text="", token_ids=(1,), calls=(CallPart(0, '{"ci', "call_1", "get_weather"),))
    more = Delta(text="", token_ids=(2,), calls=(CallPart(0, 'ty":"Paris"}'),))
    end = Finished(finish_reason="tool_calls", prompt_tokens=5, completion_tokens=3)
    parsed = check_responses_stream(stream(OBJECTS, rows(STARTED, text("Let me see."), calls, more, end)))
    output = parsed.terminal["response"]["output"]
    assert [i["type"] for i in output] == ["message", "function_call"]
    assert output[1]["arguments"] == '{"city":"Paris"}' and output[1]["call_id"] == "call_1"
    kinds = [e["type"] for e in parsed.events]
    assert kinds.index("response.output_item.done") < kinds.index("response.function_call_arguments.delta")
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)


def test_a_length_cut_is_incomplete_and_a_failure_failed():
    cut = Finished(finish_reason="length", prompt_tokens=5, completion_tokens=1)
    parsed = check_responses_stream(stream(OBJECTS, rows(STARTED, text("x"), cut)))
    final = parsed.terminal["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"

    lost = errors.WORKER_LOST.entry()
    parsed = check_responses_stream(stream(OBJECTS, rows(STARTED, text("x"), lost)))
    final = Response.model_validate(parsed.terminal["response"], strict=True)
    assert (
        final.status == "failed"
        and final.error.code == "server_error"
        and "worker_lost" in final.error.message
    )
    too_long = errors.CONTEXT_LENGTH.entry("too long")
    assert OBJECTS.answer(rows(too_long)).body["error"]["code"] == "invalid_prompt"


def test_a_cancelled_response_ends_without_an_event():
    stop = Finished(finish_reason="cancelled", prompt_tokens=5, completion_tokens=1)
    parsed = check_responses_stream(stream(OBJECTS, rows(STARTED, text("x"), stop)), complete=False)
    assert parsed.terminal is None and parsed.events[-1]["type"] == "response.output_item.done"
    assert OBJECTS.answer(rows(STARTED, text("x"), stop)).body["status"] == "cancelled"


def test_a_response_in_progress_shows_its_output_so_far():
    assert OBJECTS.answer([]).body["status"] == "queued"
    now = OBJECTS.answer(rows(STARTED, text("Hel"), text("lo"))).body
    assert now["status"] == "in_progress" and now["output"][0]["content"][0]["text"] == "Hello"
    assert now["usage"] is None


def test_keepalives_and_errors_never_break_the_sdk_decoder():
    events = response_events(OBJECTS, None)
    raw = events.opening() + KEEPALIVE + events.error(errors.UNAVAILABLE, "gone")
    decoded = list(openai.Stream(cast_to=object, response=_response(raw), client=_client()))
    assert [e["type"] for e in decoded] == ["response.created", "response.queued", "error"]
    assert decoded[-1]["sequence_number"] == 1  # a resume from it misses nothing


@pytest.mark.parametrize("cursor", ["-1", "x", "1.5", "99999999999", "\uff11"])
def test_a_bad_cursor_is_refused(cursor):
    with pytest.raises(BadCursor):
        response_events(OBJECTS, cursor)


def _response(raw: bytes) -> httpx.Response:
    return httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})


def _client() -> openai.OpenAI:
    return openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")


def test_a_custom_tool_s_call_streams_its_input_not_its_arguments():
    """The worker writes a custom call as a function call of `{"input": ...}`; the Response
    gives the input back, cut anywhere in its escapes, as OpenAI's custom_tool_call."""
    custom = {"type": "custom", "name": "apply_patch", "description": None, "format": {"type": "text"}}
    objects = ResponseObjects("resp_abc", 1700000000, "m", {"tools": [custom]})
    arguments = '{"input": "*** Begin Patch\\n+say \\"hi\\" \\ud83d\\ude00\\n*** End Patch\\n"}'
    cuts = [arguments[:12], arguments[12:27], arguments[27:40], arguments[40:]]
    entries = rows(
        STARTED,
        Delta(text="", token_ids=(1,), calls=(CallPart(0, cuts[0], "call_1", "apply_patch"),)),
        *(Delta(text="", token_ids=(2,), calls=(CallPart(0, cut),)) for cut in cuts[1:]),
        DONE,
    )
    parsed = check_responses_stream(stream(objects, entries))
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)
    patch = '*** Begin Patch\n+say "hi" 😀\n*** End Patch\n'
    deltas = [e["delta"] for e in parsed.events if e["type"] == "response.custom_tool_call_input.delta"]
    [done] = [e for e in parsed.events if e["type"] == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == patch == done["input"] and len(deltas) > 1
    final = Response.model_validate(parsed.terminal["response"], strict=True)
    [call] = final.output
    assert call.type == "custom_tool_call" and call.input == patch and call.call_id == "call_1"
    assert call.id == done["item_id"] == "ctc_abc_0"
    assert not any("function_call" in e["type"] for e in parsed.events)


def test_a_namespaced_call_comes_back_as_its_function_and_namespace():
    namespaced = ResponseObjects(
        "resp_abc",
        1700000000,
        "m",
        {"namespaces": {"multi_agent_v1__spawn_agent": ["multi_agent_v1", "spawn_agent"]}},
    )
    call = Delta(text="", token_ids=(1,), calls=(CallPart(0, "{}", "call_1", "multi_agent_v1__spawn_agent"),))
    plain = Delta(text="", token_ids=(2,), calls=(CallPart(1, "{}", "call_2", "get_weather"),))
    end = Finished(finish_reason="tool_calls", prompt_tokens=5, completion_tokens=2)
    parsed = check_responses_stream(stream(namespaced, rows(STARTED, call, plain, end)))
    first, second = parsed.terminal["response"]["output"]
    assert (first["name"], first["namespace"]) == ("spawn_agent", "multi_agent_v1")
    assert second["name"] == "get_weather" and "namespace" not in second
    added = [e["item"] for e in parsed.events if e["type"] == "response.output_item.added"]
    assert added[0]["namespace"] == "multi_agent_v1" and added[0]["name"] == "spawn_agent"
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)
    final = Response.model_validate(parsed.terminal["response"], strict=True)
    assert final.output[0].type == "function_call" and final.output[0].namespace == "multi_agent_v1"


def test_reasoning_asked_for_sealed_is_sealed_once_done_the_same_on_every_path():
    seals = Seals(["s" * 32])
    job = JobState(
        id="resp_abc",
        endpoint="responses",
        model="m",
        created=1700000000,
        owner="o" * 64,
        status=JobStatus.DONE,
        echo='{"include_reasoning": true, "store": false}',
    )
    objects = ResponseObjects.of(job, seals.seal)
    thought = Delta(text="", token_ids=(1,), reasoning="2 < 3")
    entries = rows(STARTED, thought, text("Yes"), DONE)
    parsed = check_responses_stream(stream(objects, entries))
    reasoning = parsed.terminal["response"]["output"][0]
    assert seals.open("o" * 64, reasoning["encrypted_content"]) == "2 < 3"
    assert seals.open("p" * 64, reasoning["encrypted_content"]) is None
    added = next(e for e in parsed.events if e["type"] == "response.output_item.added")
    assert "encrypted_content" not in added["item"]  # an open item's thinking is not sealed yet
    done = next(e for e in parsed.events if e["type"] == "response.output_item.done")
    assert done["item"]["encrypted_content"] == reasoning["encrypted_content"]
    assert ResponseObjects.of(job, seals.seal).answer(entries).body == parsed.terminal["response"]
    for event in parsed.events:
        EVENT.validate_python(event, strict=True)
    unasked = dataclasses.replace(job, echo='{"store": false}')
    plain = ResponseObjects.of(unasked, seals.seal).answer(entries).body["output"][0]
    assert "encrypted_content" not in plain
