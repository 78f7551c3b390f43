"""gpt-oss's harmony format: the reply's messages told apart by their channels.

A gpt-oss answer is a run of messages, each a header and a body: `<|channel|>analysis<|message|>`
thinking, then `<|end|><|start|>assistant<|channel|>final<|message|>` the answer; a tool call
is a `commentary` message whose header names its recipient (`to=functions.get_weather`,
before or after the channel, with `<|constrain|>json` or `json` after it) and whose body is
the call's arguments, ended by `<|call|>`. llama.cpp renders `<|channel|>`, `<|message|>`,
`<|start|>` and `<|constrain|>` as their text (it makes them user-defined tokens for this),
`<|end|>` as its text or as nothing (by llama.cpp's version), and `<|return|>` and `<|call|>`
end generation: so the text a reply reads holds every marker it needs, and a body ends at
`<|end|>` or where the next `<|start|>` begins.

`Harmony` wraps the job's reply (worker/text/replies.py) like `Thinking` does: `analysis`
goes to `Parts.reasoning`, `final` (and a `commentary` message to nobody: a preamble) to the
reply as content, and a message to `functions.<name>` becomes a tool call. It reads
characters one state at a time whatever the pieces, so a continuation that feeds it the text
earlier attempts generated is where they were, and a replay splits the same. Text that is
not harmony (a header that never reaches `<|message|>`) is content, as it came.
"""

from __future__ import annotations

import re

from contract.entries import CallPart
from worker.text.replies import Parts, Reply, call_id

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
BOUNDARIES = (END, START)  # what ends a message's body (`<|end|>` may render as text, or as nothing)
# a thinking budget's close: the analysis message ends, the final one begins
CLOSING = f"{END}{START}assistant{CHANNEL}final{MESSAGE}"
MAX_HEADER = 256  # characters: a header longer than this is not one
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([A-Za-z_]+)")


def is_harmony(token_texts: set[str]) -> bool:
    """Whether a vocabulary speaks harmony: it has every one of its markers."""
    return all(m in token_texts for m in MARKERS)


def opened_channel(prompt_tail: str) -> str | None:
    """The channel a rendered prompt leaves a message open in (its end: the generation
    prompt), or None when the model writes the next header itself (`<|start|>assistant`)."""
    last = prompt_tail[prompt_tail.rfind(START) + len(START) :] if START in prompt_tail else prompt_tail
    if MESSAGE not in last:
        return None
    found = _CHANNEL.search(last.partition(MESSAGE)[0])
    return found.group(1) if found else None


class Harmony:
    """A harmony reply: `thought` once an analysis message began; `closed_at` where the
    first message after the thinking begins in the text fed so far (None while the thinking
    goes on, or when there was none), for counting its tokens."""

    _HEADER, _BODY, _RAW = range(3)

    def __init__(self, reply: Reply, job_id: str, opened: str | None = None) -> None:
        self._reply = reply
        self._job_id = job_id
        self._state = self._HEADER
        self._held = ""  # a header so far, or a body's text that may begin `<|start|>`
        self._channel = ""
        self._recipient = ""
        self._fed = 0
        self._calls = 0  # calls whose header was read
        self._complete = 0
        self.thought = False
        self.closed_at: int | None = None
        self._pending = Parts()  # a call's first fragment, sent with its body's first text
        if opened is not None:
            self._open(opened, "")

    @property
    def calls(self) -> int:
        return self._complete + self._reply.calls

    def feed(self, text: str) -> Parts:
        out = Parts()
        for i, char in enumerate(text):
            if self._state == self._RAW:
                self._fed += len(text) - i
                return out.add(self._reply.feed(text[i:]))
            self._fed += 1
            if self._state == self._HEADER:
                self._header(char, out)
            else:
                self._body(char, out)
        return out

    def _header(self, char: str, out: Parts) -> None:
        held = self._held + char
        if held.endswith(MESSAGE):
            head = held[: -len(MESSAGE)]
            channel = _CHANNEL.search(head)
            recipient = _RECIPIENT.search(head)
            self._held = ""
            self._open(channel.group(1) if channel else "", recipient.group(1) if recipient else "")
        elif len(held) > MAX_HEADER or ("\n" in held and CHANNEL not in held):
            self._state, self._held = self._RAW, ""  # not harmony: the text is the answer
            out.add(self._reply.feed(held))
        else:
            self._held = held

    def _open(self, channel: str, recipient: str) -> None:
        self._state, self._channel, self._recipient = self._BODY, channel, recipient
        if channel == "analysis" and not recipient and self.closed_at is None:
            self.thought = True
        if self._calling():
            index = self._calls
            self._calls += 1
            name = recipient.removeprefix("functions.")
            self._pending = Parts(calls=[CallPart(index, "", call_id(self._job_id, index), name)])
        else:
            self._pending = Parts()

    def _calling(self) -> bool:
        return bool(self._recipient) and self._recipient != "assistant"

    def _body(self, char: str, out: Parts) -> None:
        if self._pending:
            out.add(self._pending)
            self._pending = Parts()
        held = self._held + char
        if held in BOUNDARIES:  # the message ends; the next one's header follows
            self._end_message()
            self._state, self._held = self._HEADER, held if held == START else ""
            if self.thought and self.closed_at is None and self._channel == "analysis":
                self.closed_at = self._fed - len(held)
            return
        if any(b.startswith(held) for b in BOUNDARIES):
            self._held = held
            return
        keep = next(
            (k for k in range(len(held) - 1, 0, -1) if any(b.startswith(held[-k:]) for b in BOUNDARIES)), 0
        )
        self._emit(held[: len(held) - keep], out)
        self._held = held[len(held) - keep :]

    def _emit(self, text: str, out: Parts) -> None:
        if not text:
            return
        if self._calling():
            out.add(Parts(calls=[CallPart(self._calls - 1, text)]))
        elif self._channel == "analysis":
            out.reasoning += text
        else:  # final, or a preamble to the user
            out.add(self._reply.feed(text))

    def _end_message(self) -> None:
        if self._calling():
            self._complete += 1

    def end(self) -> Parts:
        """What was held: a body's last characters, and a call ended by `<|call|>`."""
        out = Parts()
        if self._pending:
            out.add(self._pending)
            self._pending = Parts()
        held, self._held = self._held, ""
        if self._state == self._BODY:
            self._emit(held, out)
            self._end_message()
            self._state = self._HEADER
        elif self._state == self._HEADER and held and not self.thought and not self._calls:
            out.add(self._reply.feed(held))  # an unfinished header and nothing else: text
        return out.add(self._reply.end())
