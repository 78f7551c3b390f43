"""The OpenAI objects of the completion surfaces (chat and legacy text), built the same way on
every path: the streamed chunks, the answer assembled from a job's entries, and the small
status objects.

`Chunks` holds what every object of one completion carries (id, created, model); `ChatChunks`
and `TextChunks` differ only in the shape of a choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.entries import CANCELLED, STOP, Delta, Failed, Finished
from contract.errors import failure_body, status_of
from contract.keys import JobStatus

Rows = list[tuple[str, object]]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(entry: Finished) -> str:
    """A cancelled job ends like a stop string: the completion surfaces have no other word."""
    return STOP if entry.finish_reason == CANCELLED else entry.finish_reason


@dataclass(frozen=True)
class Chunks:
    object = ""  # the response object's name
    chunk_object = ""  # the streamed chunks' object name

    id: str
    created: int
    model: str
    include_usage: bool = False

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

    def _message(self, text: str, finish_reason: str) -> dict:
        raise NotImplementedError

    def opening(self) -> dict | None:
        """The chunk sent before any entry, if the surface has one."""
        return None

    def content(self, text: str) -> dict:
        return self._chunk([self._choice(text, None)])

    def keepalive(self) -> dict:
        """An empty chunk that every OpenAI client parses and ignores (see api/sse.py)."""
        return self._chunk([self._choice(None, None)])

    def finish(self, entry: Finished) -> dict:
        return self._chunk([self._choice(None, finish_reason(entry))])

    def usage(self, entry: Finished) -> dict:
        obj = self._chunk([])
        obj["usage"] = usage(entry.prompt_tokens, entry.completion_tokens)
        return obj

    def answer(self, rows: Rows) -> Answer | None:
        """The whole response from a job's entries (all of them, from the first), once its
        terminal entry is among them; None before."""
        text: list[str] = []
        for _, entry in rows:
            if isinstance(entry, Delta):
                text.append(entry.text)
            elif isinstance(entry, Failed):
                return Answer(status_of(entry), failure_body(entry))
            elif isinstance(entry, Finished):
                return Answer(200, self._completion("".join(text), entry))
        return None

    def _completion(self, text: str, entry: Finished) -> dict:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [self._message(text, finish_reason(entry))],
            "usage": usage(entry.prompt_tokens, entry.completion_tokens),
        }

    def status(self, queued: bool) -> dict:
        """What a job that has not ended looks like (202, and a background job's POST)."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "status": "queued" if queued else "in_progress",
        }

    def cancelled(self, status: str) -> dict:
        """The answer to a cancel: the job's status after it (an ended job is not changed;
        a running one stops at its next token)."""
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

    def _message(self, text: str, finish_reason: str) -> dict:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }

    def opening(self) -> dict | None:
        """The role, once, before any content."""
        return self._chunk([self._choice("", None, role=True)])


class TextChunks(Chunks):
    object = "text_completion"
    chunk_object = "text_completion"

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}

    def _message(self, text: str, finish_reason: str) -> dict:
        return self._choice(text, finish_reason)


@dataclass(frozen=True)
class Answer:
    """A non-streamed response: its status and body."""

    status: int
    body: dict
