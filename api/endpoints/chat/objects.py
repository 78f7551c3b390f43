"""The OpenAI objects of the completion endpoints (chat and legacy text).

They are built the same way on every path. They are the streamed chunks, the answers and the
small status objects. An answer is assembled from a job's entries.

`Chunks` holds what every object of one completion carries (id, created, model). `ChatChunks`
and the legacy completions' `TextChunks` differ only in the shape of a choice
(api/endpoints/completions/objects.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from api.endpoints.protocol import Answer
from api.jobs.state import JobState
from contract.entries import (
    CANCELLED,
    STOP,
    CallPart,
    Delta,
    Failed,
    Finished,
    Rows,
    TokenLogprob,
    join_calls,
)
from contract.errors import failure_body, status_of
from contract.keys import JobStatus


def usage(entry: Finished) -> dict:
    """OpenAI's usage. `cached_tokens` are the prompt tokens the worker's slot already held.
    `reasoning_tokens` are the completion's tokens of thinking (worker/text/thinking.py)."""
    return {
        "prompt_tokens": entry.prompt_tokens,
        "completion_tokens": entry.completion_tokens,
        "total_tokens": entry.prompt_tokens + entry.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": entry.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": entry.reasoning_tokens},
    }


def finish_reason(entry: Finished) -> str:
    """A cancelled job ends like a stop string. The completion endpoints have no other word."""
    return STOP if entry.finish_reason == CANCELLED else entry.finish_reason


@dataclass(frozen=True)
class Chunks:
    # the response object's name
    object = ""
    # the streamed chunks' object name
    chunk_object = ""

    id: str
    created: int
    model: str
    include_usage: bool = False
    # REASONING_FIELD when the job was created ("both")
    reasoning_field: str = "reasoning_content"

    @classmethod
    def of(cls, job: JobState) -> Chunks:
        return cls(job.id, job.created, job.model, job.include_usage, job.reasoning_field)

    def _thinking(self, holder: dict, text: str) -> None:
        """A reasoning model's thinking, in the field (or both fields) the job says."""
        if text:
            for name in ("reasoning_content", "reasoning"):
                if self.reasoning_field in (name, "both"):
                    holder[name] = text

    def _chunk(self, choices: list[dict]) -> dict:
        obj = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            obj["usage"] = None
        return obj

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        raise NotImplementedError

    def _message(self, text: str, finish_reason: str, out: Output) -> dict:
        raise NotImplementedError

    def _delta_choice(self, entry: Delta) -> dict:
        """A delta's choice when it carries more than text (tool calls, logprobs)."""
        raise NotImplementedError

    def opening(self) -> dict | None:
        """The chunk sent before any entry, if the endpoint has one."""
        return None

    def content(self, text: str) -> dict:
        return self._chunk([self._choice(text, None)])

    def delta(self, entry: Delta) -> dict:
        return self._chunk([self._delta_choice(entry)])

    def keepalive(self) -> dict:
        """An empty chunk that every OpenAI client parses and ignores (see api/streaming/sse.py)."""
        return self._chunk([self._choice(None, None)])

    def finish(self, entry: Finished) -> dict:
        return self._chunk([self._choice(None, finish_reason(entry))])

    def usage(self, entry: Finished) -> dict:
        obj = self._chunk([])
        obj["usage"] = usage(entry)
        return obj

    def answer(self, rows: Rows) -> Answer | None:
        """The whole response from a job's entries (all of them, from the first). None before its
        terminal entry is among them."""
        out = Output()
        for _, entry in rows:
            if isinstance(entry, Delta):
                out.add(entry)
            elif isinstance(entry, Failed):
                return Answer(status_of(entry), failure_body(entry))
            elif isinstance(entry, Finished):
                return Answer(200, self._completion(out, entry))
        return None

    def _completion(self, out: Output, entry: Finished) -> dict:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [self._message(out.text(), finish_reason(entry), out)],
            "usage": usage(entry),
        }

    def pending(self, queued: bool) -> Answer:
        """What a job that has not ended looks like (a GET, and a background job's POST)."""
        status = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "status": "queued" if queued else "in_progress",
        }
        return Answer(202, status)

    def cancelled(self, status: str) -> dict:
        """The answer to a cancel: the job's status after it. An ended job is not changed. A running
        one stops at its next token."""
        word = {
            JobStatus.DONE: "completed",
            JobStatus.FAILED: "failed",
            JobStatus.CANCELLED: "cancelled",
        }.get(status, "cancelling")
        return {"id": self.id, "object": self.object, "status": word}

    def deleted(self) -> dict:
        return {"id": self.id, "object": f"{self.object}.deleted", "deleted": True}


class ChatChunks(Chunks):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
        delta: dict = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def _delta_choice(self, entry: Delta) -> dict:
        choice = self._choice(entry.text or None, None)
        self._thinking(choice["delta"], entry.reasoning)
        if entry.calls:
            choice["delta"]["tool_calls"] = [_call_delta(c) for c in entry.calls]
        if entry.logprobs:
            choice["logprobs"] = {"content": [_chat_logprob(lp) for lp in entry.logprobs], "refusal": None}
        return choice

    def _message(self, text: str, finish_reason: str, out: Output) -> dict:
        message: dict = {
            "role": "assistant",
            "content": text if text or not out.calls else None,
            "refusal": None,
        }
        self._thinking(message, "".join(out.reasoning))
        if out.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in out.calls
            ]
        logprobs = None
        if out.logprobs is not None:
            logprobs = {"content": [_chat_logprob(lp) for lp in out.logprobs], "refusal": None}
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def opening(self) -> dict | None:
        """The role, once, before any content."""
        return self._chunk([self._choice("", None, role=True)])


def _call_delta(part: CallPart) -> dict:
    """OpenAI's streamed tool call: id, type and name with the first fragment."""
    if part.id:
        return {
            "index": part.index,
            "id": part.id,
            "type": "function",
            "function": {"name": part.name, "arguments": part.arguments},
        }
    return {"index": part.index, "function": {"arguments": part.arguments}}


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


def _chat_logprob(lp: TokenLogprob) -> dict:
    return {
        "token": token_text(lp.piece),
        "logprob": lp.logprob,
        "bytes": list(lp.piece),
        "top_logprobs": [{"token": token_text(b), "logprob": v, "bytes": list(b)} for b, v in lp.top],
    }


@dataclass
class Output:
    """A job's output so far, from its deltas: text, whole tool calls, logprobs."""

    parts: list[str] = field(default_factory=list)
    # one per call, arguments joined
    calls: list[CallPart] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    # a reasoning model's thinking
    reasoning: list[str] = field(default_factory=list)

    def add(self, entry: Delta) -> None:
        self.parts.append(entry.text)
        self.reasoning.append(entry.reasoning)
        join_calls(self.calls, entry.calls)
        if entry.logprobs:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(entry.logprobs)

    def text(self) -> str:
        return "".join(self.parts)
