"""The Hermes protocol, for templates that render `tools` themselves and teach
`<tool_call>{"name": ..., "arguments": ...}</tool_call>`. Hermes, Qwen 2.5 and 3, SmolLM3's
upstream template and many fine-tunes teach it. The conversation goes to the template as it
is. The reply reads calls between content."""

from __future__ import annotations

from contract.gbnf import Grammar, composed, literal
from contract.jobspec import JobSpec
from worker.text.json_scan import SPACE, JsonScanner, ScanError
from worker.text.replies import Calls, Parts, PlainReply, Reply
from worker.tools.call_rules import (
    arguments_value,
    call_rule,
    chosen,
    only_calls,
    response_grammar,
    response_rule,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesTools:
    name = "hermes"
    # where the template reads an assistant's sent-back thinking
    reasoning_key = "reasoning_content"

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        out: list[dict] = []
        for m in spec.messages:
            msg: dict = {"role": m.role, "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments_value(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            if m.role == "tool":
                msg["tool_call_id"] = m.tool_call_id
            # Qwen3's templates read it (and render it in the current turn)
            if m.reasoning:
                msg[self.reasoning_key] = m.reasoning
            out.append(msg)
        if not spec.uses_tools:
            return out, {}
        tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in chosen(spec)
        ]
        return out, {"tools": tools}

    def grammar(self, spec: JobSpec) -> str | None:
        if not spec.uses_tools:
            return response_grammar(spec)

        def build(g: Grammar) -> str:
            call = call_rule(spec, g)
            block = g.define(
                g.name("block"), f'{literal(OPEN)} "\\n"? {call} "\\n"? {literal("</tool_call>")}'
            )
            blocks = f'{block} ("\\n" {block})*' if spec.parallel_tool_calls else block
            # from the token holding the tag on (what it holds before it too)
            if self.trigger(spec):
                return f"[^<]* {blocks}"
            if only_calls(spec):
                return blocks
            return f"{g.define(g.name('blocks'), blocks)} | {response_rule(spec, g)}"

        return composed(build)

    def trigger(self, spec: JobSpec) -> str | None:
        """With "auto" and no response format, the answer is free text until a call. The
        calls' grammar applies from the first `<tool_call>` on. It admits only offered tools
        and their schemas, and nothing after the calls. It admits one call unless
        parallel_tool_calls."""
        auto_text = spec.uses_tools and not only_calls(spec) and spec.response_format is None
        return OPEN if auto_text else None

    def reply(self, spec: JobSpec) -> Reply:
        return HermesReply(spec.id) if spec.uses_tools else PlainReply()


class HermesReply:
    """Content, with calls between `<tool_call>` and `</tool_call>` (Hermes, Qwen and the
    templates that teach it). Each call is a JSON object `{"name": ..., "arguments": {...}}`.
    Text that might start the opening tag is held back until it is not. Without a grammar
    (tool_choice auto), a call that is not that JSON is given back as content."""

    def __init__(self, job_id: str) -> None:
        self._calls = Calls(job_id)
        # "content", "call" (its JSON), "closing" (after it)
        self._state = "content"
        # content that may be the start of OPEN; in "closing", what came
        self._held = ""
        self._scanner = JsonScanner(self)
        # a call's text so far (given back as content if it is not a call)
        self._body = ""

    @property
    def calls(self) -> int:
        return self._calls.complete

    def feed(self, text: str) -> Parts:
        out = Parts()
        for ch in text:
            out.add(self._char(ch))
        if self._state == "call" and self._calls.count > self._calls.complete:
            self._calls.arguments(self._scanner.take_raw())
        return out.add(self._take())

    def end(self) -> Parts:
        out = Parts(content=self._held if self._state == "content" else "")
        self._held = ""
        # a call cut off (max_tokens): its fragments stand
        return out.add(self._take())

    def _take(self) -> Parts:
        out, self._calls.out = self._calls.out, Parts()
        return out

    def _char(self, ch: str) -> Parts:
        if self._state == "content":
            self._held += ch
            if self._held.endswith(OPEN):
                content, self._held = self._held[: -len(OPEN)], ""
                self._state, self._scanner, self._body = "call", JsonScanner(self), ""
                return Parts(content=content)
            keep = max((n for n in range(1, len(OPEN)) if self._held.endswith(OPEN[:n])), default=0)
            cut = len(self._held) - keep
            content, self._held = self._held[:cut], self._held[cut:]
            return Parts(content=content)
        if self._state == "call":
            if self._scanner.done:
                self._state, self._held = "closing", ""
                return self._char(ch)
            self._body += ch
            try:
                self._scanner.feed(ch)
            except ScanError:
                return self._not_a_call()
            return Parts()
        # closing: spaces, then CLOSE; anything else is content again
        if ch in SPACE and not self._held:
            return Parts()
        self._held += ch
        if CLOSE.startswith(self._held):
            if self._held == CLOSE:
                self._state, self._held = "content", ""
            return Parts()
        text, self._held, self._state = self._held, "", "content"
        return self._char_all(text)

    def _char_all(self, text: str) -> Parts:
        out = Parts()
        for ch in text:
            out.add(self._char(ch))
        return out

    def _not_a_call(self) -> Parts:
        text = OPEN + self._body
        self._state, self._body = "content", ""
        # its name went out already: it stands
        if self._calls.count > self._calls.complete:
            self._calls.complete += 1
            return Parts()
        return Parts(content=text)

    def started(self, path: tuple, kind: str) -> None:
        if path == ("arguments",):
            self._scanner.capture(path)

    def text(self, path: tuple, ch: str) -> None:
        if path == ("name",):
            self._calls.name_text(ch)

    def ended(self, path: tuple) -> None:
        if path == ("name",):
            self._calls.name_done()
        elif path == ("arguments",):
            self._calls.arguments(self._scanner.take_raw())
            self._calls.complete += 1
