"""Checks a raw SSE response body against tokenspool's stream contract, byte for byte.

Used by every integration test that streams, and by the benchmarks that check their streams
(bench/faults/chaos.py, bench/scale_out.py): whatever the path (normal, stop, length, error,
keep-alives), the stream must parse for every OpenAI client and end with `data: [DONE]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

RECOVERED = ": continued on another worker"


@dataclass
class Parsed:
    chunks: list[dict] = field(default_factory=list)  # every JSON event, in order
    text: str = ""
    deltas: list[str] = field(default_factory=list)  # non-empty content pieces
    finish_reason: str | None = None
    usage: dict | None = None
    error: dict | None = None
    keepalives: int = 0


def split_events(raw: bytes) -> list[str]:
    text = raw.decode("utf-8")  # must be valid UTF-8 as a whole
    assert text.endswith("\n\n"), "the stream must end with a blank line"
    events = text[:-2].split("\n\n")
    for ev in events:
        # a takeover's note (api/streaming/sse.py RECOVERED): a comment line opening an event with data
        lines = [line for line in ev.split("\n") if line != RECOVERED]
        data_lines = [line for line in lines if line.startswith("data: ")]
        assert len(data_lines) == 1, f"every event carries exactly one data line: {ev!r}"
        assert all(line.startswith(("data: ", "id: ")) for line in lines), f"unexpected line in {ev!r}"
        assert "\r" not in ev
    return [next(line for line in ev.split("\n") if line.startswith("data: "))[6:] for ev in events]


def check_stream(raw: bytes, kind: str, include_usage: bool = False) -> Parsed:
    datas = split_events(raw)
    assert datas[-1] == "[DONE]", "the stream must end with data: [DONE]"
    assert datas.count("[DONE]") == 1
    out = Parsed()
    out.chunks = [json.loads(d) for d in datas[:-1]]
    if out.chunks and "error" in out.chunks[-1]:
        out.error = out.chunks.pop()["error"]
        assert set(out.error) == {"message", "type", "param", "code"}
        assert isinstance(out.error["message"], str) and out.error["message"]
    assert all("error" not in c for c in out.chunks), "an error event is always the last before [DONE]"
    if not out.chunks:
        assert out.error is not None and kind == "text"
        return out

    first = out.chunks[0]
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    assert first["id"].startswith(prefix)
    for c in out.chunks:
        assert (c["id"], c["object"], c["created"], c["model"]) == (
            first["id"],
            obj,
            first["created"],
            first["model"],
        ), "every chunk carries the same id, object, created and model"
        if include_usage:
            assert "usage" in c
        else:
            assert "usage" not in c

    body = out.chunks
    if include_usage and out.error is None:
        *body, last = out.chunks
        assert last["choices"] == [] and isinstance(last["usage"], dict)
        u = last["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens"] > 0
        out.usage = u
    for c in body:
        assert len(c["choices"]) == 1, c
        if include_usage:
            assert c["usage"] is None

    if kind == "chat":
        assert body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert body[0]["choices"][0]["finish_reason"] is None
        body = body[1:]
    final = None
    if out.error is None:
        *body, final_chunk = body
        final = final_chunk["choices"][0]
        assert final["finish_reason"] in ("stop", "length")
        if kind == "chat":
            assert final["delta"] == {}
        else:
            assert final["text"] == ""
        out.finish_reason = final["finish_reason"]
    for c in body:
        choice = c["choices"][0]
        assert "finish_reason" in choice and choice["finish_reason"] is None, "non-final chunks: null"
        assert choice["index"] == 0 and "logprobs" in choice
        if kind == "chat":
            assert "role" not in choice["delta"], "the role is never repeated"
            piece = choice["delta"].get("content")
            if piece is None:
                assert choice["delta"] == {}
                out.keepalives += 1
                continue
        else:
            piece = choice["text"]
            if piece == "":
                out.keepalives += 1
                continue
        assert isinstance(piece, str) and piece
        out.deltas.append(piece)
    out.text = "".join(out.deltas)
    return out


def read_opening(lines) -> tuple[list[str], dict]:
    """Consume SSE lines up to and including the first data event's line; returns the lines
    read and that event's JSON (the role chunk, for chat)."""
    got = []
    for line in lines:
        got.append(line)
        if line.startswith("data: "):
            return got, json.loads(line[len("data: ") :])
    raise AssertionError("the stream ended before its first event")


@dataclass
class ResponseStream:
    events: list[dict] = field(default_factory=list)  # every event, in order
    text: str = ""  # the output text, from its deltas
    terminal: dict | None = None  # the last event if it ends the response (None: cancelled, cut)
    keepalives: int = 0


TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def check_responses_stream(raw: bytes, starting_after: int = -1, complete: bool = True) -> ResponseStream:
    """A Responses API stream, byte for byte: `event:`, `id:` (the sequence number) and one
    `data:` line per event, keep-alives only as a lone comment line (never a blank-line
    terminated block: openai-python would parse it as JSON), no [DONE]; sequence numbers from
    `starting_after + 1`, up by one; response.created first (from the start), exactly one
    terminal event, last (with `complete`); every delta inside its item and content part, and
    the done events repeat what the deltas built."""
    text = raw.decode("utf-8")
    out = ResponseStream()
    out.keepalives = text.count(": keepalive\n")
    text = text.replace(": keepalive\n", "")
    assert text.endswith("\n\n") or not text, "the stream must end with a blank line"
    for block in text[:-2].split("\n\n") if text else []:
        lines = block.split("\n")
        assert [line.split(":", 1)[0] for line in lines] == ["event", "id", "data"], block
        event = json.loads(lines[2][len("data: ") :])
        assert lines[0] == f"event: {event['type']}" and lines[1] == f"id: {event['sequence_number']}"
        out.events.append(event)
    numbers = [e["sequence_number"] for e in out.events]
    assert numbers == list(range(starting_after + 1, starting_after + 1 + len(numbers))), numbers
    kinds = [e["type"] for e in out.events]
    assert "[DONE]" not in text
    if starting_after < 0:
        assert kinds[:1] == ["response.created"] and kinds[1] in ("response.in_progress", "response.queued")
    ends = [k for k in kinds if k in TERMINAL]
    assert len(ends) <= 1 and (not ends or kinds[-1] == ends[0]), kinds
    if complete:
        assert ends, f"no terminal event: {kinds[-3:]}"
    if ends:
        out.terminal = out.events[-1]
        assert out.terminal["response"]["status"] == ends[0].removeprefix("response.")
    _check_items(out, from_start=starting_after < 0)
    return out


def _check_items(out: ResponseStream, from_start: bool) -> None:
    """Deltas land in items announced before them; the done events and the final Response
    carry the text the deltas built."""
    texts: dict[int, str] = {}
    inputs: dict[int, str] = {}  # custom tool calls' input, from their deltas
    items: dict[int, dict] = {}
    for e in out.events:
        kind = e["type"]
        if kind == "response.output_item.added":
            items[e["output_index"]] = e["item"]
            assert e["item"]["status"] == "in_progress"
        elif kind == "response.output_text.delta":
            assert not from_start or e["output_index"] in items, "a delta before its item"
            assert e["item_id"] == f"msg_{e['item_id'][4:]}" and e["logprobs"] == []
            texts[e["output_index"]] = texts.get(e["output_index"], "") + e["delta"]
            out.text += e["delta"]
        elif kind == "response.output_text.done" and from_start:
            assert e["text"] == texts.get(e["output_index"], "")
        elif kind == "response.custom_tool_call_input.delta":
            assert not from_start or e["output_index"] in items, "a delta before its item"
            inputs[e["output_index"]] = inputs.get(e["output_index"], "") + e["delta"]
        elif kind == "response.custom_tool_call_input.done" and from_start:
            assert e["input"] == inputs.get(e["output_index"], "")
        elif kind == "response.output_item.done":
            assert e["item"]["status"] in ("completed", "incomplete")
            if from_start:
                assert e["item"]["id"] == items[e["output_index"]]["id"]
    if out.terminal is not None and from_start:
        output = out.terminal["response"]["output"]
        assert [i["id"] for i in output] == [items[n]["id"] for n in sorted(items)]
        for n, item in enumerate(output):
            if item["type"] == "message":
                assert item["content"][0]["text"] == texts.get(n, "")
