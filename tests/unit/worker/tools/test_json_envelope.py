"""worker.tools.json_envelope's reply: the JSON envelope read as the model writes it, however it is cut."""

import json

import pytest

from tests.unit.worker.reading import CID, calls, run
from worker.text.replies import Parts, call_id
from worker.tools.json_envelope import JsonReply


@pytest.mark.parametrize("seed", range(5))
def test_generic_single_call(seed):
    text = '{ "tool_call": { "name": "get_weather", "arguments": { "city": "Paris", "days": [1, 2] } } }'
    reply = JsonReply(CID)
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
    out = run(JsonReply(CID), text, seed)
    got = calls(out)
    assert [c["name"] for c in got] == ["a", "b"]
    assert json.loads(got[0]["arguments"]) == {"x": 1500.0}
    assert json.loads(got[1]["arguments"]) == {"s": 'q"uote}'}
    assert got[1]["id"] == call_id(CID, 1) != got[0]["id"]


@pytest.mark.parametrize("seed", range(5))
def test_generic_response_is_content_decoded(seed):
    text = '{"response": "Line one\\nd\\u00e9j\\u00e0 vu \\ud83d\\ude00 \\"ok\\""}'
    reply = JsonReply(CID)
    out = run(reply, text, seed)
    assert out.content == 'Line one\ndéjà vu 😀 "ok"'
    assert out.calls == [] and reply.calls == 0


def test_generic_response_that_is_an_object_is_its_json_text():
    text = '{"response": {"answer": [1, {"b": null}]} }'
    out = run(JsonReply(CID), text)
    assert json.loads(out.content) == {"answer": [1, {"b": None}]}


def test_a_continuation_goes_on_where_the_text_left_off():
    text = '{"tool_calls": [{"name": "a", "arguments": {"x": "yz"}}, {"name": "b", "arguments": {}}]}'
    whole = JsonReply(CID)
    first = whole.feed(text[:30])
    rest = whole.feed(text[30:]).add(whole.end())
    resumed = JsonReply(CID)
    resumed.feed(text[:30])  # what the earlier attempt generated, replayed
    again = resumed.feed(text[30:]).add(resumed.end())
    assert again.calls == rest.calls and again.content == rest.content
    assert calls(Parts().add(first).add(rest))[1] == {"id": call_id(CID, 1), "name": "b", "arguments": "{}"}
