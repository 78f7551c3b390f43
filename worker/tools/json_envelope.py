"""The JSON envelope protocol, for any chat template (llama.cpp's "Generic" format). A system
message describes the tools and the answer's envelope. That envelope is
`{"tool_call": {"name": ..., "arguments": {...}}}`, `{"tool_calls": [...]}`, or
`{"response": "..."}`. The reply reads the envelope as the model writes it."""

from __future__ import annotations

import json

from contract.gbnf import Grammar, composed, json_literal
from contract.jobspec import JobSpec, Message
from worker.text.json_scan import JsonScanner
from worker.text.replies import Calls, Parts, PlainReply, Reply
from worker.tools.call_rules import (
    arguments_value,
    call_rule,
    chosen,
    only_calls,
    response_grammar,
    response_rule,
)


class JsonTools:
    name = "json"

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        out: list[dict] = []
        names = {c.id: c.name for m in spec.messages for c in m.tool_calls}
        for m in spec.messages:
            if m.tool_calls:
                out.append({"role": "assistant", "content": self._envelope(m)})
            elif m.role == "tool":
                result = {
                    "tool": names.get(m.tool_call_id, ""),
                    "tool_call_id": m.tool_call_id,
                    "content": m.content,
                }
                out.append({"role": "user", "content": json.dumps({"tool_response": result}, indent=2)})
            else:
                out.append({"role": m.role, "content": m.content})
        if spec.uses_tools:
            text = self._instructions(spec)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
            else:
                out.insert(0, {"role": "system", "content": text})
        return out, {}

    def _envelope(self, m: Message) -> str:
        calls = [{"name": c.name, "arguments": arguments_value(c.arguments)} for c in m.tool_calls]
        body: dict = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
        return json.dumps(body, indent=2, ensure_ascii=False)

    def _instructions(self, spec: JobSpec) -> str:
        tools = [
            {"name": t.name, "description": t.description, "parameters": t.parameters} for t in chosen(spec)
        ]
        call = '{"name": "<tool name>", "arguments": {<its arguments>}}'
        many = f'{{"tool_calls": [{call}, ...]}}'
        one = f'{{"tool_call": {call}}}'
        envelope = many if spec.parallel_tool_calls else one
        if only_calls(spec):
            ask = f"Respond in JSON format, calling {'the tool' if spec.named_tool else 'tools'}: {envelope}"
        else:
            ask = (
                "Respond in JSON format, either to call tools: "
                f'{envelope}, or to reply to the user: {{"response": <your reply>}}'
            )
        return (
            "You can call the following tools to satisfy the user's requests:\n"
            + json.dumps(tools, indent=2, ensure_ascii=False)
            + "\n\n"
            + ask
        )

    def grammar(self, spec: JobSpec) -> str | None:
        if not spec.uses_tools:
            return response_grammar(spec)

        def build(g: Grammar) -> str:
            call = call_rule(spec, g)
            if spec.parallel_tool_calls:
                many = f'"[" ws {call} ("," ws {call})* "]" ws'
                env = f'"{{" ws {json_literal("tool_calls")} ws ":" ws {many} "}}" ws'
            else:
                env = f'"{{" ws {json_literal("tool_call")} ws ":" ws {call} "}}" ws'
            calls = g.define(g.name("envelope"), env)
            if only_calls(spec):
                return calls
            response = response_rule(spec, g)
            answer = g.define(
                g.name("answer"), f'"{{" ws {json_literal("response")} ws ":" ws {response} "}}" ws'
            )
            return f"{calls} | {answer}"

        return composed(build)

    def trigger(self, spec: JobSpec) -> str | None:
        # the envelope is constrained from its first token
        return None

    def reply(self, spec: JobSpec) -> Reply:
        return JsonReply(spec.id) if spec.uses_tools else PlainReply()


class JsonReply:
    """The JSON envelope (llama.cpp's "Generic" format, for templates without tool syntax).
    It is `{"tool_call": CALL}`, `{"tool_calls": [CALL, ...]}` or `{"response": ...}`. CALL is
    `{"name": ..., "arguments": {...}}`. The grammar guarantees the shape. A response that is a
    string streams as content. Any other value streams as its JSON text."""

    def __init__(self, job_id: str) -> None:
        self._calls = Calls(job_id)
        self._scanner = JsonScanner(self)
        self._raw_response = False

    @property
    def calls(self) -> int:
        return self._calls.complete

    def feed(self, text: str) -> Parts:
        self._scanner.feed(text)
        return self._take()

    def end(self) -> Parts:
        self._scanner.finish()
        return self._take()

    def _take(self) -> Parts:
        out = self._calls.out
        if self._raw_response or self._call_arguments_open():
            raw = self._scanner.take_raw()
            if self._raw_response:
                out.content += raw
            else:
                self._calls.arguments(raw)
                out = self._calls.out
        self._calls.out = Parts()
        return out

    def _call_arguments_open(self) -> bool:
        return self._calls.count > self._calls.complete

    @staticmethod
    def _call_path(path: tuple) -> tuple | None:
        """The part of `path` inside a call object, if it is inside one."""
        if path[:1] == ("tool_call",):
            return path[1:]
        if path[:1] == ("tool_calls",) and len(path) >= 2:
            return path[2:]
        return None

    def started(self, path: tuple, kind: str) -> None:
        if path == ("response",) and kind != "str":
            self._raw_response = True
            self._scanner.capture(path)
        inner = self._call_path(path)
        if inner == ("arguments",):
            self._scanner.capture(path)

    def text(self, path: tuple, ch: str) -> None:
        if path == ("response",):
            self._calls.out.content += ch
        elif self._call_path(path) == ("name",):
            self._calls.name_text(ch)

    def ended(self, path: tuple) -> None:
        inner = self._call_path(path)
        if inner == ("name",):
            self._calls.name_done()
        elif inner == ("arguments",):
            self._calls.arguments(self._scanner.take_raw())
            self._calls.complete += 1
        elif path == ("response",) and self._raw_response:
            self._calls.out.content += self._scanner.take_raw()
            self._raw_response = False
