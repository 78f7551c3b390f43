"""Checks a raw SSE response body against tokenspool's stream contract, byte for byte.

Used by every integration test that streams: whatever the path (normal, stop, length, error,
keep-alives), the stream must parse for every OpenAI client and end with `data: [DONE]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


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
        lines = ev.split("\n")
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
