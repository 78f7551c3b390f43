"""What the client sees of a reply: content, and the tool calls the model wrote.

A model calls a tool by writing text in a syntax its prompt taught it. The syntaxes are in
worker/tools/, whose protocols each hold their reply (worker/tools/json_envelope.py,
worker/tools/hermes.py). It may be a JSON envelope: `{"tool_call": {"name": ..., "arguments": {...}}}`,
`{"tool_calls": [...]}`, or `{"response": "..."}` for plain content. It may be Hermes tags
(`<tool_call>{...}</tool_call>` between content). A `Reply` reads the generated text piece by
piece. For each piece, it says what content and which tool-call fragments it holds, the way OpenAI
streams them. A call's id and name come once its name is complete. Then its arguments' JSON text
comes in fragments that concatenate to it.

A reply is deterministic in its text. A continuation on another worker feeds it the text the
earlier attempts generated, discarding what it returns. Then it goes on where they left off,
mid-call included. Call ids are derived from the job id and the call's index, so a continuation
names the calls the same.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field
from typing import Protocol

from contract.entries import CallPart, join_calls

_B62 = string.ascii_letters + string.digits


@dataclass
class Parts:
    content: str = ""
    calls: list[CallPart] = field(default_factory=list)
    # a reasoning model's thinking (worker/text/thinking.py)
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.calls or self.reasoning)

    def add(self, other: Parts) -> Parts:
        self.reasoning += other.reasoning
        self.content += other.content
        join_calls(self.calls, other.calls)
        return self


def call_id(job_id: str, index: int) -> str:
    """`call_` and 24 letters or digits, the same on every attempt of the job."""
    n = int.from_bytes(hashlib.sha256(f"{job_id}:{index}".encode()).digest(), "big")
    out = []
    for _ in range(24):
        n, r = divmod(n, 62)
        out.append(_B62[r])
    return "call_" + "".join(out)


class Reply(Protocol):
    # complete tool calls so far
    calls: int

    def feed(self, text: str) -> Parts: ...
    def end(self) -> Parts: ...


class PlainReply:
    """No tools: the text is the content."""

    calls = 0

    def feed(self, text: str) -> Parts:
        return Parts(content=text)

    def end(self) -> Parts:
        return Parts()


class Calls:
    """Collects call parts. A call's name (at `name_at`) opens it, and its arguments (raw, at
    `args_at`) stream after."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.out = Parts()
        # calls whose name is known
        self.count = 0
        self.complete = 0
        self._name: list[str] = []

    def name_text(self, ch: str) -> None:
        self._name.append(ch)

    def name_done(self) -> None:
        index = self.count
        self.count += 1
        name = "".join(self._name)
        self._name = []
        self.out.add(Parts(calls=[CallPart(index, "", call_id(self.job_id, index), name)]))

    def arguments(self, raw: str) -> None:
        if raw and self.count:
            self.out.add(Parts(calls=[CallPart(self.count - 1, raw)]))
