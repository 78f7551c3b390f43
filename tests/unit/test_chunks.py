import json

from hypothesis import given, settings
from hypothesis import strategies as st

from api import sse
from api.chunks import Chunks, completion_object


def decode(raw: bytes) -> dict:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    body = raw[len(b"data: ") : -2]
    assert b"\n" not in body and b"\r" not in body
    return json.loads(body)


def test_chat_chunks_follow_the_openai_shape():
    c = Chunks("chat", "chatcmpl-1", 123, "m")
    first = c.opening()
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert c.content("hi")["choices"][0]["delta"] == {"content": "hi"}
    assert c.content("hi")["choices"][0]["finish_reason"] is None
    last = c.finish("stop")["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop"
    for chunk in (first, c.content("x"), c.keepalive(), c.finish("length")):
        assert (chunk["id"], chunk["object"], chunk["created"], chunk["model"]) == (
            "chatcmpl-1",
            "chat.completion.chunk",
            123,
            "m",
        )
        assert "usage" not in chunk


def test_with_include_usage_every_chunk_has_usage_null_and_the_last_has_it():
    c = Chunks("chat", "chatcmpl-1", 1, "m", include_usage=True)
    assert c.opening()["usage"] is None and c.content("x")["usage"] is None
    u = c.usage(3, 4)
    assert u["choices"] == [] and u["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }


def test_keepalive_is_an_empty_non_final_chunk():
    chat = Chunks("chat", "c", 1, "m").keepalive()["choices"][0]
    assert chat["delta"] == {} and chat["finish_reason"] is None
    text = Chunks("text", "cmpl-1", 1, "m").keepalive()["choices"][0]
    assert text["text"] == "" and text["finish_reason"] is None


def test_legacy_chunks_are_text_completion_objects():
    c = Chunks("text", "cmpl-1", 1, "m")
    assert c.opening() is None
    chunk = c.content("abc")
    assert chunk["object"] == "text_completion"
    assert chunk["choices"] == [{"text": "abc", "index": 0, "logprobs": None, "finish_reason": None}]
    assert c.finish("length")["choices"][0] == {
        "text": "",
        "index": 0,
        "logprobs": None,
        "finish_reason": "length",
    }


def test_sse_event_is_one_line_of_json_even_with_newlines_and_unicode():
    raw = sse.event({"text": "a\nb\r\nバ\u2028"})
    assert decode(raw) == {"text": "a\nb\r\nバ\u2028"}
    assert raw.decode().count("\n") == 2


def test_sse_event_id_line_comes_first():
    assert sse.event({"a": 1}, "5-0") == b'id: 5-0\ndata: {"a":1}\n\n'
    assert sse.DONE == b"data: [DONE]\n\n"


def test_completion_objects():
    chat = completion_object("chat", "chatcmpl-1", 1, "m", "hello", "stop", 2, 3)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    assert chat["usage"]["total_tokens"] == 5
    text = completion_object("text", "cmpl-1", 1, "m", "hello", "length", 2, 3)
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "hello"


@settings(max_examples=300)
@given(text=st.text(), kind=st.sampled_from(["chat", "text"]), usage=st.booleans())
def test_templated_content_events_are_byte_identical(text, kind, usage):
    chunks = Chunks(kind, "chatcmpl-x" if kind == "chat" else "cmpl-x", 1, "m", include_usage=usage)
    fast = sse.ContentEvents(chunks.content)
    assert fast.event(text, "17-3") == sse.event(chunks.content(text), "17-3")
