"""The Responses API's objects (a Response, its output items, its stream events). One
`ResponseTranscript` builds them from a job's entries.

The events are a pure function of the entries. The same entries give the same events with the
same `sequence_number`s on every path. The paths are the live stream, a replay from any API
process, a GET. So `starting_after=N` is "the events numbered above N". A Response fetched
later is the one the stream ended with. The shapes follow openai-python's types, validated in
strict mode by the tests. They also follow what openai-node's and the AI SDK's stream readers
require.

A call to a namespaced function carries the function's own `name` and its `namespace`. Both
are as the request named them (api/endpoints/responses/offered.py). A response may be asked
for with `include: ["reasoning.encrypted_content"]`. It then seals each reasoning item's
thinking into its `encrypted_content`, once the item is done
(api/endpoints/responses/sealing.py). The seal is the same on every path, as the events are.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from api.endpoints.protocol import Answer
from api.jobs.state import JobState
from contract.entries import CANCELLED, LENGTH, Delta, Entry, Failed, Finished, Rows, Started
from contract.errors import status_of
from contract.freeform.calls import InputReader
from contract.jobspec import TEMPERATURE, TOP_P

ID_PREFIX = "resp_"
# the events that carry output (the relay counts them)
DELTA_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)


def item_id(response_id: str, kind: str, index: int) -> str:
    """Output item `index` of a response: `msg_…`, `rs_…`, `fc_…` or `ctc_…`. They are read back for
    `item_reference` (api/endpoints/responses/items.py)."""
    return f"{kind}_{response_id.removeprefix(ID_PREFIX)}_{index}"


def _usage(entry: Finished) -> dict:
    return {
        "input_tokens": entry.prompt_tokens,
        "input_tokens_details": {"cached_tokens": entry.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": entry.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": entry.reasoning_tokens},
        "total_tokens": entry.prompt_tokens + entry.completion_tokens,
    }


def _part(kind: str, text: str) -> dict:
    """The content part of a message item, or of a reasoning item (its thinking)."""
    if kind == "message":
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {"type": "reasoning_text", "text": text}


def _payload(custom: bool) -> str:
    """What a call item holds as it streams: a custom call's input, a function call's arguments."""
    return "input" if custom else "arguments"


def _error(entry: Failed) -> dict:
    """A failure as the Response's `error`. Its codes are a closed list in the SDKs, so the server's
    own code goes into the message."""
    code = "invalid_prompt" if status_of(entry) < 500 else "server_error"
    return {"code": code, "message": f"{entry.message} ({entry.code})" if entry.code else entry.message}


@dataclass(frozen=True)
class ResponseObjects:
    """What every object of one response carries. `echo` is what the Response repeats of its
    request, as recorded with the job (api/endpoints/responses/body.py)."""

    object = "response"

    id: str
    created: int
    model: str
    echo: dict = field(default_factory=dict)
    # thinking -> its seal, for the job's key
    seal: Callable[[str], str] | None = None

    @classmethod
    def of(cls, job: JobState, seal: Callable[[str, str], str] | None = None) -> ResponseObjects:
        """`seal(owner, text)`: how this process seals (used where the request asked)."""
        echo = json.loads(job.echo) if job.echo else {}
        own = (lambda text: seal(job.owner, text)) if seal and echo.get("include_reasoning") else None
        return cls(job.id, job.created, job.model, echo, own)

    @property
    def seals(self) -> bool:
        """Whether its reasoning items are sealed (the request asked)."""
        return bool(self.echo.get("include_reasoning"))

    @property
    def background(self) -> bool:
        return bool(self.echo.get("background"))

    @property
    def custom_tools(self) -> frozenset[str]:
        """The names of the request's custom tools: their calls are `custom_tool_call`s."""
        return frozenset(t["name"] for t in self.echo.get("tools", ()) if t.get("type") == "custom")

    @property
    def stored(self) -> bool:
        return self.echo.get("store", True) is not False

    def transcript(self) -> ResponseTranscript:
        return ResponseTranscript(self)

    def response(self, status: str, output: list[dict], usage: dict | None = None, **ended: object) -> dict:
        """The Response object: every key the SDKs' types list, `null` where unset."""
        echo = self.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": self.background,
            "completed_at": ended.get("completed_at"),
            "error": ended.get("error"),
            "incomplete_details": ended.get("incomplete_details"),
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": echo.get("previous_response_id"),
            "prompt_cache_key": echo.get("prompt_cache_key"),
            "reasoning": echo.get("reasoning", {"effort": None, "summary": None}),
            "service_tier": echo.get("service_tier", "default"),
            "store": self.stored,
            "temperature": echo.get("temperature", TEMPERATURE),
            "text": {"format": echo.get("format", {"type": "text"}), "verbosity": "medium"},
            "tool_choice": echo.get("tool_choice", "auto"),
            "tools": echo.get("tools", []),
            "top_logprobs": 0,
            "top_p": echo.get("top_p", TOP_P),
            "truncation": "disabled",
            "usage": usage,
            "user": echo.get("user"),
            "metadata": echo.get("metadata") or {},
        }

    def answer(self, rows: Rows) -> Answer:
        """The Response as it stands after `rows` (all of the job's entries so far)."""
        transcript = self.transcript()
        transcript.start()
        for eid, entry in rows:
            transcript.feed(eid, entry)
        return Answer(200, transcript.response())

    def pending(self, queued: bool) -> Answer:
        return Answer(200, self.response("queued" if queued else "in_progress", []))

    def deleted(self) -> dict:
        return {"id": self.id, "object": "response.deleted", "deleted": True}


class ResponseTranscript:
    """Feeds a job's entries, in order from its first, into the response's output items. It feeds
    them into its stream events too. Call `start` first: its events are numbered from 0."""

    def __init__(self, objects: ResponseObjects) -> None:
        self._o = objects
        self.seq = -1
        self.output: list[dict] = []
        # the open message or reasoning item's text so far
        self._text: list[str] = []
        # an open call's arguments (or input) so far, by output index
        self._args: dict[int, list[str]] = {}
        # an open custom call's input, read from its arguments
        self._inputs: dict[int, InputReader] = {}
        self._custom = objects.custom_tools
        # a tool call's index in the job -> its output index
        self._calls: dict[int, int] = {}
        # the output index of the item being written
        self._open: int | None = None
        self._started = False
        self.status = "queued" if objects.background else "in_progress"
        self._usage: dict | None = None
        self._ended: dict = {}

    def start(self) -> list[dict]:
        """The opening events, sent before any entry: created, then queued or in_progress. Queued is
        for a background response, which waits for a worker."""
        events = [self._event("response.created", response=self.response())]
        if self._o.background:
            return [*events, self._event("response.queued", response=self.response())]
        self._started = True
        return [*events, self._event("response.in_progress", response=self.response())]

    def response(self) -> dict:
        return self._o.response(self.status, self._output(), self._usage, **self._ended)

    def feed(self, eid: str, entry: Entry) -> list[dict]:
        """The events one entry makes (none for most of a crash's extra Started)."""
        if isinstance(entry, Started):
            if self._started:
                return []
            self._started = True
            self.status = "in_progress"
            return [self._event("response.in_progress", response=self.response())]
        if isinstance(entry, Delta):
            return self._delta(entry)
        if isinstance(entry, Finished):
            return self._finished(eid, entry)
        if isinstance(entry, Failed):
            events = self._close("incomplete")
            self.status = "failed"
            self._ended = {"error": _error(entry)}
            return [*events, self._event("response.failed", response=self.response())]
        return []

    def _delta(self, entry: Delta) -> list[dict]:
        """A reasoning model's thinking goes into a reasoning item, before the message."""
        events = self._write("reasoning", entry.reasoning) + self._write("message", entry.text)
        for part in entry.calls:
            # a new call
            if part.id:
                events += self._close("completed")
                events += self._open_call(part.index, part.id, part.name)
            at = self._calls.get(part.index, -1)
            # a closed call gets no more
            if at not in self._args or not part.arguments:
                continue
            delta, kind = part.arguments, "response.function_call_arguments.delta"
            if at in self._inputs:
                delta, kind = self._inputs[at].feed(part.arguments), "response.custom_tool_call_input.delta"
                if not delta:
                    continue
            self._args[at].append(delta)
            events.append(self._event(kind, item_id=self.output[at]["id"], output_index=at, delta=delta))
        return events

    def _write(self, kind: str, text: str) -> list[dict]:
        """Text into the open item of `kind` ("message" or "reasoning"), opened if need be."""
        if not text:
            return []
        events = []
        if self._open is None or self.output[self._open]["type"] != kind:
            events += self._close("completed")
            events += self._open_text(kind)
        self._text.append(text)
        extra: dict = {"logprobs": []} if kind == "message" else {}
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        at = self._open
        common = {"item_id": self.output[at]["id"], "output_index": at, "content_index": 0}  # type: ignore[index]
        return [*events, self._event(name, **common, delta=text, **extra)]

    def _open_text(self, kind: str) -> list[dict]:
        index = len(self.output)
        item: dict = {"id": item_id(self._o.id, "msg" if kind == "message" else "rs", index), "type": kind}
        if kind == "message":
            item |= {"status": "in_progress", "content": [], "role": "assistant"}
        else:
            item |= {"summary": [], "status": "in_progress", "content": []}
        self.output.append(item)
        self._open, self._text = index, []
        part = _part(kind, "")
        return [
            self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item)),
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def _open_call(self, call_index: int, call_id: str, name: str) -> list[dict]:
        """A function call, or a custom tool's call (its input read out of the arguments)."""
        index = len(self.output)
        custom = name in self._custom
        item = {
            "id": item_id(self._o.id, "ctc" if custom else "fc", index),
            "type": "custom_tool_call" if custom else "function_call",
            "status": "in_progress",
            _payload(custom): "",
            "call_id": call_id,
            "name": name,
        }
        if custom:
            self._inputs[index] = InputReader()
        if namespaced := self._o.echo.get("namespaces", {}).get(name):
            item |= {"namespace": namespaced[0], "name": namespaced[1]}
        self.output.append(item)
        self._open = index
        self._calls[call_index] = index
        self._args[index] = []
        return [self._event("response.output_item.added", output_index=index, item=copy.deepcopy(item))]

    def _close(self, status: str) -> list[dict]:
        """End the open item (if any) with `status`: its done events, the whole item last."""
        index, self._open = self._open, None
        if index is None:
            return []
        item = self.output[index]
        item["status"] = status
        events = []
        if item["type"] in ("message", "reasoning"):
            text = "".join(self._text)
            part = _part(item["type"], text)
            item["content"] = [part]
            if item["type"] == "reasoning" and self._o.seal is not None:
                item["encrypted_content"] = self._o.seal(text)
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            if item["type"] == "message":
                events.append(self._event("response.output_text.done", **common, text=text, logprobs=[]))
            else:
                events.append(self._event("response.reasoning_text.done", **common, text=text))
            events.append(self._event("response.content_part.done", **common, part=copy.deepcopy(part)))
        elif item["type"] == "custom_tool_call":
            self._args.pop(index)
            item["input"] = self._inputs.pop(index).done()
            events.append(
                self._event(
                    "response.custom_tool_call_input.done",
                    item_id=item["id"],
                    output_index=index,
                    input=item["input"],
                )
            )
        else:
            item["arguments"] = "".join(self._args.pop(index))
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
        events.append(self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item)))
        return events

    def _finished(self, eid: str, entry: Finished) -> list[dict]:
        """A completed response ends with response.completed. One cut at its token limit ends with
        response.incomplete. A cancelled one ends without an event, as no SDK knows one."""
        reason = entry.finish_reason
        events = self._close("incomplete" if reason in (LENGTH, CANCELLED) else "completed")
        self._usage = _usage(entry)
        if reason == CANCELLED:
            self.status = "cancelled"
            return events
        if reason == LENGTH:
            self.status = "incomplete"
            self._ended = {"incomplete_details": {"reason": "max_output_tokens"}}
            return [*events, self._event("response.incomplete", response=self.response())]
        self.status = "completed"
        self._ended = {"completed_at": int(eid.split("-")[0]) // 1000 if eid else self._o.created}
        return [*events, self._event("response.completed", response=self.response())]

    def _output(self) -> list[dict]:
        """The output items as they stand (an open item's text or arguments so far)."""
        out = copy.deepcopy(self.output)
        if self._open is not None:
            item = out[self._open]
            if item["type"] in ("message", "reasoning"):
                item["content"] = [_part(item["type"], "".join(self._text))]
            else:
                item[_payload(item["type"] == "custom_tool_call")] = "".join(self._args[self._open])
        return out

    def _event(self, kind: str, **fields: object) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq, **fields}
