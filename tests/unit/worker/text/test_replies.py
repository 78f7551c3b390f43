"""worker.text.replies: content and tool-call fragments from generated text, however it is cut."""

import json
import random

import pytest

from worker.text.replies import CallPart, GenericReply, HermesReply, Parts, PlainReply, call_id

CID = "chatcmpl-x"


def run(reply, text: str, seed: int = 0) -> Parts:
    """Feed `text` in random pieces; everything the reply said, merged."""
    rng = random.Random(seed)
    out, i = Parts(), 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.add(reply.feed(text[i : i + n]))
        i += n
    return out.add(reply.end())


def calls(parts: Parts) -> list[dict]:
    """The calls as OpenAI's accumulated message holds them."""
    merged: dict[int, dict] = {}
    for p in parts.calls:
        c = merged.setdefault(p.index, {"id": "", "name": "", "arguments": ""})
        c["id"] += p.id
        c["name"] += p.name
        c["arguments"] += p.arguments
    return [merged[i] for i in sorted(merged)]


@pytest.mark.parametrize("seed", range(5))
def test_generic_single_call(seed):
    text = '{ "tool_call": { "name": "get_weather", "arguments": { "city": "Paris", "days": [1, 2] } } }'
    reply = GenericReply(CID)
    out = run(reply, text, seed)
    assert out.content == ""
    assert calls(out) == [
        {"id": call_id(CID, 0), "name": "get_weather", "arguments": '{ "city": "Paris", "days": [1, 2] }'}
    ]
    assert reply.calls == 1


@pytest.mark.parametrize("seed", range(5))
def test_generic_parallel_calls(seed):
    text = (
        '{"tool_calls": [{"name": "a", "arguments": {"x": 1.5e3}}, '
        '{"name": "b", "arguments": {"s": "q\\"uote}"}}]}'
    )
    out = run(GenericReply(CID), text, seed)
    got = calls(out)
    assert [c["name"] for c in got] == ["a", "b"]
    assert json.loads(got[0]["arguments"]) == {"x": 1500.0}
    assert json.loads(got[1]["arguments"]) == {"s": 'q"uote}'}
    assert got[1]["id"] == call_id(CID, 1) != got[0]["id"]


@pytest.mark.parametrize("seed", range(5))
def test_generic_response_is_content_decoded(seed):
    text = '{"response": "Line one\\nd\\u00e9j\\u00e0 vu \\ud83d\\ude00 \\"ok\\""}'
    reply = GenericReply(CID)
    out = run(reply, text, seed)
    assert out.content == 'Line one\ndéjà vu 😀 "ok"'
    assert out.calls == [] and reply.calls == 0


def test_generic_response_that_is_an_object_is_its_json_text():
    text = '{"response": {"answer": [1, {"b": null}]} }'
    out = run(GenericReply(CID), text)
    assert json.loads(out.content) == {"answer": [1, {"b": None}]}


def test_a_continuation_goes_on_where_the_text_left_off():
    text = '{"tool_calls": [{"name": "a", "arguments": {"x": "yz"}}, {"name": "b", "arguments": {}}]}'
    whole = GenericReply(CID)
    first = whole.feed(text[:30])
    rest = whole.feed(text[30:]).add(whole.end())
    resumed = GenericReply(CID)
    resumed.feed(text[:30])  # what the earlier attempt generated, replayed
    again = resumed.feed(text[30:]).add(resumed.end())
    assert again.calls == rest.calls and again.content == rest.content
    assert calls(Parts().add(first).add(rest))[1] == {"id": call_id(CID, 1), "name": "b", "arguments": "{}"}


@pytest.mark.parametrize("seed", range(5))
def test_hermes_content_then_calls(seed):
    text = (
        "Let me check <tool. <tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call> done'
    )
    reply = HermesReply(CID)
    out = run(reply, text, seed)
    assert out.content == "Let me check <tool. \n done"
    assert calls(out) == [
        {"id": call_id(CID, 0), "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"id": call_id(CID, 1), "name": "get_time", "arguments": "{}"},
    ]
    assert reply.calls == 2


def test_hermes_text_that_is_not_a_call_stays_content():
    out = run(HermesReply(CID), "a <tool_call> not json </tool_call> b")
    assert out.content == "a <tool_call> not json </tool_call> b" and not out.calls


def test_hermes_holds_back_only_what_may_open_a_call():
    reply = HermesReply(CID)
    assert reply.feed("hi <tool").content == "hi "
    assert reply.feed("box").content == "<toolbox"
    assert reply.end().content == ""


def test_plain_reply_is_content():
    assert PlainReply().feed("abc") == Parts(content="abc")


def test_call_ids_are_stable_and_openai_shaped():
    assert call_id(CID, 0) == call_id(CID, 0) != call_id(CID, 1) != call_id("other", 1)
    assert call_id(CID, 0).startswith("call_") and len(call_id(CID, 0)) == 29


def test_parts_merge_fragments_of_one_call():
    p = Parts().add(Parts(calls=[CallPart(0, "", "call_1", "f")])).add(Parts(calls=[CallPart(0, "{}")]))
    assert p.calls == [CallPart(0, "{}", "call_1", "f")]
