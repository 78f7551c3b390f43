"""The Messages API's objects (a Message, its content blocks, its stream events). One
`MessageTranscript` builds them from a job's entries.

As for Responses, the events are a pure function of the entries. The same entries give the
same events with the same numbers on every path. The paths are the live stream, a replay from
any API process, a GET. So a stream resumes after the event it names (`Last-Event-ID`, this
server's extension to Anthropic's protocol). `message_start` waits for a worker to start the
job: it carries the prompt's token count. A reasoning model's thinking is a `thinking` block,
signed with its digest. This server checks no signature: earlier thinking is left out of
prompts.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass

from api.endpoints.protocol import Answer
from api.http.errors import anthropic
from api.jobs.state import JobState
from contract import errors
from contract.entries import LENGTH, STOP, TOOL_CALLS, Delta, Entry, Failed, Finished, Rows, Started
from contract.keys import JobStatus

ID_PREFIX = "msg_"
# the event that carries output (the relay counts them)
DELTA_EVENT = "content_block_delta"
_DELTAS = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking")}


def stop_reason(entry: Finished) -> str:
    """Anthropic's word for why the job ended (a cancelled job ends its turn)."""
    if entry.finish_reason == STOP and entry.stop_sequence:
        return "stop_sequence"
    return {LENGTH: "max_tokens", TOOL_CALLS: "tool_use"}.get(entry.finish_reason, "end_turn")


def usage(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0, thinking_tokens: int = 0) -> dict:
    """Anthropic counts the prompt's tokens read from the cache apart from the others."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens_details": {"thinking_tokens": thinking_tokens},
    }


def context_edits(entry: Started) -> dict | None:
    """Anthropic's `context_management` of a Message: the edits the worker applied (None: none)."""
    if not entry.cleared_tool_uses:
        return None
    edit = {
        "type": "clear_tool_uses_20250919",
        "cleared_tool_uses": entry.cleared_tool_uses,
        "cleared_input_tokens": entry.cleared_input_tokens,
    }
    return {"applied_edits": [edit]}


def failure(entry: Failed) -> tuple[int, dict]:
    """A job's failure as Anthropic's error: (HTTP status, body)."""
    return anthropic(errors.lookup(entry.code) or errors.WORKER_ERROR, entry.message)


def signature(thinking: str) -> str:
    return hashlib.sha256(thinking.encode()).hexdigest()


@dataclass(frozen=True)
class MessageObjects:
    object = "message"

    id: str
    created: int
    model: str
    # False: thinking blocks carry their signature only
    shows_thinking: bool = True

    @classmethod
    def of(cls, job: JobState) -> MessageObjects:
        echo = json.loads(job.echo) if job.echo else {}
        return cls(job.id, job.created, job.model, echo.get("thinking_display") != "omitted")

    def transcript(self) -> MessageTranscript:
        return MessageTranscript(self)

    def message(
        self,
        content: list[dict],
        usage: dict,
        reason: str | None = None,
        sequence: str | None = None,
        edits: dict | None = None,
    ) -> dict:
        """`edits`: the context management the worker applied (`context_edits`), if any."""
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage,
        }
        return message | {"context_management": edits} if edits else message

    def answer(self, rows: Rows) -> Answer | None:
        """The Message once the job has ended (its error if it failed). None before."""
        transcript = self.transcript()
        for eid, entry in rows:
            transcript.feed(eid, entry)
            if isinstance(entry, Failed):
                return Answer(*failure(entry))
            if isinstance(entry, Finished):
                return Answer(200, transcript.message())
        return None

    def pending(self, queued: bool) -> Answer:
        """A Message not ended yet (no stop_reason): Anthropic's API has no such state."""
        return Answer(202, self.message([], usage(0, 0)))

    def cancelled(self, status: str) -> dict:
        word = {JobStatus.DONE: "completed", JobStatus.FAILED: "failed", JobStatus.CANCELLED: "cancelled"}
        return {"id": self.id, "type": "message", "status": word.get(status, "cancelling")}

    def deleted(self) -> dict:
        return {"id": self.id, "type": "message_deleted", "deleted": True}


class MessageTranscript:
    """Feeds a job's entries, in order from its first, into the Message's content blocks. It feeds
    them into its stream events too, numbered from 0."""

    def __init__(self, objects: MessageObjects) -> None:
        self._o = objects
        self.seq = -1
        self.content: list[dict] = []
        # the open block's text or arguments so far
        self._parts: list[str] = []
        # the index of the open block
        self._open: int | None = None
        # a tool call's index in the job -> its block's index
        self._calls: dict[int, int] = {}
        self._prompt = 0
        # what the job's context edit cleared (its Started says)
        self._edits: dict | None = None
        self._usage = usage(0, 0)
        self._stop: tuple[str | None, str | None] = (None, None)

    def message(self) -> dict:
        edits = copy.deepcopy(self._edits)
        return self._o.message(copy.deepcopy(self.content), dict(self._usage), *self._stop, edits=edits)

    def feed(self, eid: str, entry: Entry) -> list[dict]:
        """The events one entry makes (none for a crash's later Started)."""
        if isinstance(entry, Started):
            if self.seq < 0:
                self._edits = context_edits(entry)
            return self._start(entry.prompt_tokens)
        # a stream without its Started (never written so): still in order
        events = self._start(0)
        if isinstance(entry, Delta):
            return events + self._delta(entry)
        if isinstance(entry, Finished):
            events += self._close()
            reason, sequence = stop_reason(entry), entry.stop_sequence or None
            self._stop = (reason, sequence)
            self._usage = usage(
                entry.prompt_tokens, entry.completion_tokens, entry.cached_tokens, entry.reasoning_tokens
            )
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            edits = {"context_management": copy.deepcopy(self._edits)} if self._edits else {}
            return [
                *events,
                self._event("message_delta", delta=delta, usage=dict(self._usage), **edits),
                self._event("message_stop"),
            ]
        if isinstance(entry, Failed):
            return [*events, self._event("error", error=failure(entry)[1]["error"])]
        return events

    def _start(self, prompt_tokens: int) -> list[dict]:
        if self.seq >= 0:
            return []
        self._prompt = prompt_tokens
        self._usage = usage(prompt_tokens, 0)
        return [self._event("message_start", message=self._o.message([], dict(self._usage)))]

    def _delta(self, entry: Delta) -> list[dict]:
        events = self._write("thinking", entry.reasoning) + self._write("text", entry.text)
        for part in entry.calls:
            # a new call
            if part.id:
                events += self._close()
                call = {"type": "tool_use", "id": part.id, "name": part.name, "input": {}}
                events += self._open_block(call)
                self._calls[part.index] = self._open  # type: ignore[assignment]
            at = self._calls.get(part.index)
            # a closed call gets no more
            if at is None or at != self._open or not part.arguments:
                continue
            self._parts.append(part.arguments)
            delta = {"type": "input_json_delta", "partial_json": part.arguments}
            events.append(self._event(DELTA_EVENT, index=at, delta=delta))
        return events

    def _write(self, kind: str, text: str) -> list[dict]:
        """Text into the open block of `kind` ("text" or "thinking"), opened if need be."""
        if not text:
            return []
        events = []
        if self._open is None or self.content[self._open]["type"] != kind:
            events += self._close()
            block = {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})
            events += self._open_block(block)
        self._parts.append(text)
        if kind == "thinking" and not self._o.shows_thinking:
            return events
        name, field = _DELTAS[kind]
        return [*events, self._event(DELTA_EVENT, index=self._open, delta={"type": name, field: text})]

    def _open_block(self, block: dict) -> list[dict]:
        self.content.append(block)
        self._open, self._parts = len(self.content) - 1, []
        return [self._event("content_block_start", index=self._open, content_block=copy.deepcopy(block))]

    def _close(self) -> list[dict]:
        """End the open block (if any): a thinking block's signature first."""
        index, self._open = self._open, None
        if index is None:
            return []
        block, joined = self.content[index], "".join(self._parts)
        events = []
        if block["type"] == "tool_use":
            block["input"] = _arguments(joined)
        elif block["type"] == "thinking":
            block["signature"] = signature(joined)
            block["thinking"] = joined if self._o.shows_thinking else ""
            delta = {"type": "signature_delta", "signature": block["signature"]}
            events.append(self._event(DELTA_EVENT, index=index, delta=delta))
        else:
            block["text"] = joined
        return [*events, self._event("content_block_stop", index=index)]

    def _event(self, kind: str, **fields: object) -> dict:
        self.seq += 1
        return {"type": kind, **fields}


def _arguments(text: str) -> dict:
    """A finished call's arguments (the worker's grammar makes them a JSON object)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
