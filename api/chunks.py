"""The OpenAI objects a client receives, built the same way on every path.

`Chunks` builds the streamed chunks of one completion (chat or legacy text), all carrying
the same id, object, created and model; `completion_object` builds the non-streamed
response from the same parts.
"""

from __future__ import annotations

from dataclasses import dataclass


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Chunks:
    kind: str  # "chat" or "text"
    id: str
    created: int
    model: str
    include_usage: bool = False

    def _chunk(self, choices: list[dict]) -> dict:
        obj = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            obj["usage"] = None
        return obj

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
        if self.kind == "text":
            return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def opening(self) -> dict | None:
        """The first chunk: the role, for chat; legacy completions have none."""
        return self._chunk([self._choice("", None, role=True)]) if self.kind == "chat" else None

    def content(self, text: str) -> dict:
        return self._chunk([self._choice(text, None)])

    def keepalive(self) -> dict:
        """An empty chunk that every OpenAI client parses and ignores (see api/sse.py)."""
        return self._chunk([self._choice(None if self.kind == "chat" else "", None)])

    def finish(self, reason: str) -> dict:
        return self._chunk([self._choice(None if self.kind == "chat" else "", reason)])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict:
        obj = self._chunk([])
        obj["usage"] = usage(prompt_tokens, completion_tokens)
        return obj


def completion_object(
    kind: str,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict:
    if kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj_type = "chat.completion"
    else:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        obj_type = "text_completion"
    return {
        "id": id,
        "object": obj_type,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
