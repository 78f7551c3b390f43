"""gpt-oss's harmony format: the reply's messages told apart by their channels.

A gpt-oss answer is a run of messages, each a header and a body. First comes
`<|channel|>analysis<|message|>` thinking, then `<|end|><|start|>assistant<|channel|>final<|message|>`
the answer. A tool call is a `commentary` message whose header names its recipient
(`to=functions.get_weather`). The recipient comes before or after the channel, with
`<|constrain|>json` or `json` after it. The message's body is the call's arguments, ended by
`<|call|>`. `<|channel|>`, `<|message|>`, `<|start|>` and `<|constrain|>` render as their text in
llama.cpp (it makes them user-defined tokens for this). `<|end|>` renders as its text or as
nothing, by llama.cpp's version. `<|return|>` and `<|call|>` end generation. So the text a reply
reads holds every marker it needs. A body ends at `<|end|>` or where the next `<|start|>` begins.

`Harmony` wraps the job's reply (worker/text/replies.py) like `Thinking` does. `analysis` goes to
`Parts.reasoning`. `final` goes to the reply as content, and so does a `commentary` message to
nobody (a preamble). A message to `functions.<name>` of an offered tool becomes a tool call. It
reads characters one state at a time, whatever the pieces. So a continuation that feeds it the text
earlier attempts generated is where they were, and a replay splits the same. Text that is not
harmony (a header that never reaches `<|message|>`) is content, as it came.
"""

from __future__ import annotations

import re

from contract.entries import CallPart
from worker.text.replies import Parts, Reply, call_id

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
# what ends a message's body (`<|end|>` may render as text, or as nothing)
BOUNDARIES = (END, START)
# a thinking budget's close: the analysis message ends, the final one begins
CLOSING = f"{END}{START}assistant{CHANNEL}final{MESSAGE}"
# characters: a header longer than this is not one
MAX_HEADER = 256
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([A-Za-z_]+)")


def opened_channel(prompt_tail: str) -> str | None:
    """The channel a rendered prompt leaves a message open in (its end: the generation prompt).
    None when the model writes the next header itself (`<|start|>assistant`)."""
    last = prompt_tail[prompt_tail.rfind(START) + len(START) :] if START in prompt_tail else prompt_tail
    if MESSAGE not in last:
        return None
    found = _CHANNEL.findall(last.partition(MESSAGE)[0])
    return found[-1] if found else None


class Harmony:
    """A harmony reply. `reasoning_spans` are where its analysis messages lie in the text fed so
    far, for counting their tokens. They are character offsets, the header included, and an open
    one ends at None. `in_thinking` says whether an analysis message is open now (a thinking budget
    may close it). Calls go only to the `tools` offered. A message to any other recipient (a
    built-in tool gpt-oss was trained on) is the model's own business: thinking."""

    _HEADER, _BODY, _RAW = range(3)

    def __init__(
        self, reply: Reply, job_id: str, opened: str | None = None, tools: frozenset[str] = frozenset()
    ) -> None:
        self._reply = reply
        self._job_id = job_id
        self._tools = tools
        self._state = self._HEADER
        # a header so far, or a body's text that may begin a boundary
        self._held = ""
        # where the current header began
        self._header_at = 0
        self._channel = ""
        self._recipient = ""
        self._fed = 0
        # calls whose header was read
        self._calls = 0
        self._complete = 0
        self.reasoning_spans: list[tuple[int, int | None]] = []
        # a call's first fragment, sent with its body's first text
        self._pending = Parts()
        if opened is not None:
            self._open(opened, "")

    @property
    def calls(self) -> int:
        return self._complete + self._reply.calls

    @property
    def in_thinking(self) -> bool:
        return self._state == self._BODY and self._thinking()

    def feed(self, text: str) -> Parts:
        out = Parts()
        i = 0
        while i < len(text):
            if self._state == self._RAW:
                self._fed += len(text) - i
                return out.add(self._reply.feed(text[i:]))
            # a body's text up to a `<` at once
            if self._state == self._BODY and not self._held:
                stop = text.find("<", i)
                run = text[i:] if stop < 0 else text[i:stop]
                if run:
                    self._fed += len(run)
                    self._flush_pending(out)
                    self._emit(run, out)
                    i += len(run)
                    continue
            self._fed += 1
            if self._state == self._HEADER:
                self._header(text[i], out)
            else:
                self._body(text[i], out)
            i += 1
        return out

    def _flush_pending(self, out: Parts) -> None:
        if self._pending:
            out.add(self._pending)
            self._pending = Parts()

    def _header(self, char: str, out: Parts) -> None:
        held = self._held + char
        if held.endswith(MESSAGE):
            head = held[: -len(MESSAGE)]
            # the last: gpt-oss may write a stray one first
            channels = _CHANNEL.findall(head)
            recipient = _RECIPIENT.search(head)
            self._held = ""
            self._open(channels[-1] if channels else "", recipient.group(1) if recipient else "")
        elif len(held) > MAX_HEADER or ("\n" in held and CHANNEL not in held):
            # not harmony: the text is the answer
            self._state, self._held = self._RAW, ""
            out.add(self._reply.feed(held))
        else:
            self._held = held

    def _open(self, channel: str, recipient: str) -> None:
        self._state, self._channel = self._BODY, channel
        self._recipient = "" if recipient == "assistant" else recipient
        if self._thinking():
            self.reasoning_spans.append((self._header_at, None))
        if self._calling():
            index = self._calls
            self._calls += 1
            name = self._recipient.removeprefix("functions.")
            self._pending = Parts(calls=[CallPart(index, "", call_id(self._job_id, index), name)])

    def _calling(self) -> bool:
        return self._recipient.removeprefix("functions.") in self._tools and self._recipient.startswith(
            "functions."
        )

    def _thinking(self) -> bool:
        return (self._channel == "analysis" and not self._recipient) or (
            bool(self._recipient) and not self._calling()
        )

    def _body(self, char: str, out: Parts) -> None:
        self._flush_pending(out)
        held = self._held + char
        # the message ends; the next one's header follows
        if held in BOUNDARIES:
            self._end_message(self._fed - len(held))
            self._state, self._held = self._HEADER, held if held == START else ""
            self._header_at = self._fed - len(self._held)
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
        elif self._thinking():
            out.reasoning += text
        # final, or a preamble to the user
        else:
            out.add(self._reply.feed(text))

    def _end_message(self, at: int) -> None:
        if self._calling():
            self._complete += 1
        if self._thinking() and self.reasoning_spans and self.reasoning_spans[-1][1] is None:
            self.reasoning_spans[-1] = (self.reasoning_spans[-1][0], at)

    def end(self) -> Parts:
        """What was held: a body's last characters, and a call ended by `<|call|>`."""
        out = Parts()
        self._flush_pending(out)
        held, self._held = self._held, ""
        if self._state == self._BODY:
            self._emit(held, out)
            if self._calling():
                self._complete += 1
            self._state = self._HEADER
        elif self._state == self._HEADER and held and not self.reasoning_spans and not self._calls:
            # an unfinished header and nothing else: text
            out.add(self._reply.feed(held))
        return out.add(self._reply.end())
