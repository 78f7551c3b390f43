"""A reasoning model's thinking, told apart from its answer (REASONING_FORMAT=think).

DeepSeek-R1 distills, Qwen3 and GLM write their thinking between `<think>` and `</think>`, then the
answer. Some templates open the block in the generation prompt themselves, so the output starts
inside it. Qwen3's hybrid template lets the model write `<think>` first. With thinking off, it
writes an empty block into the prompt. So the start state comes from the rendered prompt
(`opened_by`), not from the model's name.

`Thinking` wraps the job's reply (worker/text/replies.py). The thinking goes to `Parts.reasoning`,
and only the answer reaches the reply. So tool calls and JSON read after the block as they do
without one. Like every reply, it reads characters one state at a time, whatever the pieces. A
continuation feeds it the text earlier attempts generated, and it is where they were. So a split is
the same from an uninterrupted run, a resumed one, and a replay. The tags and the whitespace that
opens the answer are nobody's text.
"""

from __future__ import annotations

from worker.text.replies import Parts, Reply

OPEN, CLOSE = "<think>", "</think>"
# a block's close as models write it, when a budget ends it
CLOSING = f"\n{CLOSE}\n\n"
# of the prompt: more than the generation prompt's text after `<think>`
TAIL_TOKENS = 16


def generation_prompt(prompt: list[int], marks: frozenset[int]) -> list[int]:
    """The prompt's last tokens after its last control token (a turn's mark, as ChatML's
    `<|im_start|>`). That is the template's generation prompt, not a user's text that ends in a
    tag."""
    tail = prompt[-TAIL_TOKENS:]
    return tail[max((i + 1 for i, t in enumerate(tail) if t in marks), default=0) :]


def grammar_after(gbnf: str) -> str:
    """A grammar that holds from a thinking block's close on. The thinking before it is free. The
    close and the whitespace after it come first. It applies from the token holding the close
    (worker/engine/grammar.py `TriggeredGate`), which may hold some thinking before it."""
    if not gbnf.startswith("root ::= "):
        raise ValueError("a grammar built by contract/gbnf.py starts with its root")
    answer = "thought-answer ::= " + gbnf.removeprefix("root ::= ")
    return f'root ::= [^<]* "{CLOSE}" [ \\t\\n]* thought-answer\n{answer}'


def opened_by(prompt_tail: str) -> bool:
    """Whether a rendered prompt (its end) leaves a thinking block open."""
    return prompt_tail.rfind(OPEN) > prompt_tail.rfind(CLOSE)


class Thinking:
    """A reply's thinking part, then the reply itself. `closed_at` is where the answer starts in
    the text fed so far, for counting its tokens. It is None until the block closes."""

    _BEFORE, _THINKING, _OPENING, _ANSWER = range(4)

    def __init__(self, reply: Reply, opened: bool) -> None:
        self._reply = reply
        self._state = self._THINKING if opened else self._BEFORE
        # what may yet be a tag
        self._held = ""
        # characters read
        self._fed = 0
        # a block was opened (by the prompt or the model)
        self.thought = opened
        self.closed_at: int | None = None

    @property
    def calls(self) -> int:
        return self._reply.calls

    @property
    def reasoning_spans(self) -> list[tuple[int, int | None]]:
        """Where the thinking lies in the text fed so far. It runs from its start to the answer's
        start, or None while still open. The start is a tag the model wrote, with the whitespace
        before it."""
        return [(0, self.closed_at)] if self.thought else []

    @property
    def in_thinking(self) -> bool:
        return self.thought and self.closed_at is None

    def feed(self, text: str) -> Parts:
        out = Parts()
        for i, char in enumerate(text):
            if self._state == self._ANSWER:
                self._fed += len(text) - i
                return out.add(self._reply.feed(text[i:]))
            self._fed += 1
            self._char(char, out)
        return out

    def _char(self, char: str, out: Parts) -> None:
        # the model may open the block, after whitespace
        if self._state == self._BEFORE:
            held = self._held + char
            if OPEN.startswith(held.lstrip()):
                self._held = held
                if held.lstrip() == OPEN:
                    self._state, self._held, self.thought = self._THINKING, "", True
            # no block: the text is the answer, as it came
            else:
                self._state, self._held = self._ANSWER, ""
                out.add(self._reply.feed(held))
        elif self._state == self._THINKING:
            held = self._held + char
            if held == CLOSE:
                self._state, self._held, self.closed_at = self._OPENING, "", self._fed
            elif CLOSE.startswith(held):
                self._held = held
            else:
                keep = next((k for k in range(len(held) - 1, 0, -1) if CLOSE.startswith(held[-k:])), 0)
                out.reasoning += held[: len(held) - keep]
                self._held = held[len(held) - keep :]
        # the whitespace between the block and the answer goes
        elif not char.isspace():
            self._state = self._ANSWER
            out.add(self._reply.feed(char))
        else:
            self.closed_at = self._fed

    def end(self) -> Parts:
        """What was held: a tag begun but never finished is text of its part."""
        out = Parts()
        held, self._held = self._held, ""
        if self._state == self._THINKING:
            out.reasoning += held
        elif self._state == self._BEFORE and held:
            out.add(self._reply.feed(held))
        return out.add(self._reply.end())
