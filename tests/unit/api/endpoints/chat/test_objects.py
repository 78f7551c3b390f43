import json

from hypothesis import given, settings
from hypothesis import strategies as st

from api.endpoints.chat.objects import ChatChunks
from api.endpoints.completions.objects import TextChunks
from api.streaming import sse
from contract.entries import Delta, Failed, Finished


def finished(reason: str, prompt: int = 3, completion: int = 4) -> Finished:
    return Finished(finish_reason=reason, prompt_tokens=prompt, completion_tokens=completion)


def decode(raw: bytes) -> dict:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    body = raw[len(b"data: ") : -2]
    assert b"\n" not in body and b"\r" not in body
    return json.loads(body)


def test_chat_chunks_follow_the_openai_shape():
    c = ChatChunks("chatcmpl-1", 123, "m")
    first = c.opening()
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert c.content("hi")["choices"][0]["delta"] == {"content": "hi"}
    assert c.content("hi")["choices"][0]["finish_reason"] is None
    last = c.finish(finished("stop"))["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop"
    for chunk in (first, c.content("x"), c.keepalive(), c.finish(finished("length"))):
        assert (chunk["id"], chunk["object"], chunk["created"], chunk["model"]) == (
            "chatcmpl-1",
            "chat.completion.chunk",
            123,
            "m",
        )
        assert "usage" not in chunk


def test_with_include_usage_every_chunk_has_usage_null_and_the_last_has_it():
    c = ChatChunks("chatcmpl-1", 1, "m", include_usage=True)
    assert c.opening()["usage"] is None and c.content("x")["usage"] is None
    u = c.usage(finished("stop"))
    assert u["choices"] == [] and u["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_keepalive_is_an_empty_non_final_chunk():
    chat = ChatChunks("c", 1, "m").keepalive()["choices"][0]
    assert chat["delta"] == {} and chat["finish_reason"] is None
    text = TextChunks("cmpl-1", 1, "m").keepalive()["choices"][0]
    assert text["text"] == "" and text["finish_reason"] is None


def test_legacy_chunks_are_text_completion_objects():
    c = TextChunks("cmpl-1", 1, "m")
    assert c.opening() is None
    chunk = c.content("abc")
    assert chunk["object"] == "text_completion"
    assert chunk["choices"] == [{"text": "abc", "index": 0, "logprobs": None, "finish_reason": None}]
    assert c.finish(finished("length"))["choices"][0] == {
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


def rows(*entries) -> list:
    return [(f"{n}-0", e) for n, e in enumerate(entries, 1)]


def test_answers_from_entries():
    hello = [Delta(text="hel", token_ids=(1,)), Delta(text="lo", token_ids=(2,))]
    chat = ChatChunks("chatcmpl-1", 1, "m").answer(rows(*hello, finished("stop", 2, 3)))
    assert chat is not None and chat.status == 200
    assert chat.body["object"] == "chat.completion"
    assert chat.body["choices"][0]["message"] == {"role": "assistant", "content": "hello", "refusal": None}
    assert chat.body["usage"]["total_tokens"] == 5
    text = TextChunks("cmpl-1", 1, "m").answer(rows(*hello, finished("length", 2, 3)))
    assert text is not None and text.body["object"] == "text_completion"
    assert text.body["choices"][0]["text"] == "hello"
    assert TextChunks("cmpl-1", 1, "m").answer(rows(*hello)) is None  # not ended yet


def test_a_failure_answers_with_its_status():
    lost = Failed(message="gone", type="server_error", code="worker_lost")
    answer = ChatChunks("chatcmpl-1", 1, "m").answer(rows(Delta(text="x", token_ids=(1,)), lost))
    assert answer is not None and answer.status == 503
    assert answer.body == {
        "error": {"message": "gone", "type": "server_error", "param": None, "code": "worker_lost"}
    }


def test_a_cancelled_job_finishes_with_stop_on_the_completion_endpoints():
    c = ChatChunks("chatcmpl-1", 1, "m")
    assert c.finish(finished("cancelled"))["choices"][0]["finish_reason"] == "stop"
    answer = c.answer(rows(finished("cancelled", 2, 0)))
    assert answer is not None and answer.body["choices"][0]["finish_reason"] == "stop"


@settings(max_examples=300)
@given(text=st.text(), kind=st.sampled_from(["chat", "text"]), usage=st.booleans())
def test_templated_content_events_are_byte_identical(text, kind, usage):
    make = ChatChunks if kind == "chat" else TextChunks
    chunks = make("chatcmpl-x" if kind == "chat" else "cmpl-x", 1, "m", include_usage=usage)
    fast = sse.ContentEvents(chunks.content)
    assert fast.event(text, "17-3") == sse.event(chunks.content(text), "17-3")


def test_tool_calls_stream_openai_style_and_assemble_into_the_message():
    from contract.entries import CallPart, TokenLogprob

    c = ChatChunks("chatcmpl-t", 1, "m")
    first = Delta(epoch=1, text="", token_ids=(1,), calls=(CallPart(0, "", "call_a", "get_weather"),))
    more = Delta(epoch=1, text="", token_ids=(2, 3), calls=(CallPart(0, '{"city"'), CallPart(0, ': "Oslo"}')))
    assert c.delta(first)["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert c.delta(more)["choices"][0]["delta"]["tool_calls"][0] == {
        "index": 0,
        "function": {"arguments": '{"city"'},
    }
    done = Finished(epoch=1, finish_reason="tool_calls", prompt_tokens=3, completion_tokens=3)
    answer = c.answer([("1-0", first), ("2-0", more), ("3-0", done)])
    choice = answer.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ]
    lp = Delta(
        epoch=1,
        text="hi",
        token_ids=(5,),
        logprobs=(TokenLogprob(b"hi", -0.5, ((b"hi", -0.5), (b"\xff", -2.0))),),
    )
    chunk = c.delta(lp)["choices"][0]
    assert chunk["delta"] == {"content": "hi"}
    assert chunk["logprobs"]["content"][0] == {
        "token": "hi",
        "logprob": -0.5,
        "bytes": [104, 105],
        "top_logprobs": [
            {"token": "hi", "logprob": -0.5, "bytes": [104, 105]},
            {"token": "\ufffd", "logprob": -2.0, "bytes": [255]},
        ],
    }
    text = TextChunks("cmpl-t", 1, "m").delta(lp)["choices"][0]["logprobs"]
    assert text == {
        "tokens": ["hi"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"hi": -0.5, "\ufffd": -2.0}],
        "text_offset": [0],
    }


def test_a_takeover_is_a_comment_line_every_sse_reader_skips():
    import httpx
    import openai

    from api.endpoints.chat.events import chunk_events
    from contract.entries import Started

    c = ChatChunks("chatcmpl-1", 123, "m")
    events = chunk_events(c, None)
    rows = [
        ("1-0", Started(epoch=1, worker="w1", prompt_tokens=3)),
        ("1-1", Delta(epoch=1, text="Hello", token_ids=(1,))),
        ("2-0", Started(epoch=2, worker="w2", prompt_tokens=3)),
        ("2-1", Delta(epoch=2, text=" sea", token_ids=(2,))),
        ("2-2", finished("stop")),
    ]
    raw = events.opening() + events.encode(rows).data + events.done()
    assert raw.count(sse.RECOVERED) == 1  # the first attempt's start is no takeover
    assert sse.RECOVERED + b"id: 2-1\ndata: " in raw  # it opens the next event
    response = httpx.Response(200, content=raw, headers={"content-type": "text/event-stream"})
    client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
    chunks = list(openai.Stream(cast_to=object, response=response, client=client))
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks)
    assert text == "Hello sea" and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def _events(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(event id, the event's bytes) of an encoded stream."""
    out = []
    for ev in raw.split(b"\n\n")[:-1]:
        ids = [line[4:].decode() for line in ev.split(b"\n") if line.startswith(b"id: ")]
        out.append((ids[0] if ids else None, ev + b"\n\n"))
    return out


def test_a_resume_from_every_event_gives_exactly_the_rest():
    from api.endpoints.chat.events import chunk_events
    from api.streaming.reader import stream_id

    rows = [
        ("1-1", Delta(epoch=1, text="Hel", token_ids=(1,))),
        ("1-2", Delta(epoch=1, text="lo", token_ids=(2,))),
        ("1-3", Delta(epoch=1, text="", token_ids=(3,))),  # held back: no event
        ("1-4", Delta(epoch=1, text=" sea", token_ids=(4,))),
        ("1-5", finished("stop")),
    ]
    for usage in (False, True):
        c = ChatChunks("chatcmpl-1", 123, "m", usage)
        whole = chunk_events(c, None)
        full = _events(whole.opening() + whole.encode(rows).data)
        for n, (event_id, _) in enumerate(full):
            assert event_id is not None  # every event can be resumed after
            events = chunk_events(c, event_id)
            after, inclusive = events.read_from()
            read = [r for r in rows if stream_id(r[0]) > stream_id(after) or (inclusive and r[0] == after)]
            rest = _events(events.opening() + events.encode(read).data)
            assert rest == full[n + 1 :], (usage, event_id)


THOUGHT = [
    Delta(text="", token_ids=(1, 2), reasoning="2 < 3"),
    Delta(text="Yes", token_ids=(3, 4), reasoning=", so"),
    Delta(text=".", token_ids=(5,)),
]


def test_thinking_streams_and_answers_in_its_own_field_never_the_content():
    c = ChatChunks("chatcmpl-1", 1, "m", include_usage=True)
    deltas = [c.delta(d)["choices"][0]["delta"] for d in THOUGHT]
    assert deltas == [
        {"reasoning_content": "2 < 3"},
        {"content": "Yes", "reasoning_content": ", so"},
        {"content": "."},
    ]
    done = Finished(finish_reason="stop", prompt_tokens=3, completion_tokens=5, reasoning_tokens=4)
    answer = c.answer(rows(*THOUGHT, done))
    assert answer is not None
    message = answer.body["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Yes.", "2 < 3, so")
    assert answer.body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    assert c.usage(done)["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}


def test_the_thinking_field_is_the_one_the_job_was_created_with():
    for field, names in (("reasoning", ["reasoning"]), ("both", ["reasoning_content", "reasoning"])):
        c = ChatChunks("chatcmpl-1", 1, "m", reasoning_field=field)
        delta = c.delta(THOUGHT[0])["choices"][0]["delta"]
        assert sorted(delta) == sorted(names) and all(delta[n] == "2 < 3" for n in names)
    plain = ChatChunks("chatcmpl-1", 1, "m").answer(rows(Delta(text="hi", token_ids=(1,)), finished("stop")))
    assert plain is not None and "reasoning_content" not in plain.body["choices"][0]["message"]
