"""How a model is told about tools and how it writes its calls: one protocol per kind of
chat template, chosen once per model from what its template does.

- `HermesTools`: the template renders `tools` itself and teaches `<tool_call>{"name": ...,
  "arguments": ...}</tool_call>` (Hermes, Qwen 2.5 and 3, SmolLM3's upstream template and
  many fine-tunes): the conversation goes to the template as it is, tool calls and tool
  results included.
- `JsonTools`: any other template (SmolLM2's renders roles and contents only): llama.cpp's
  "Generic" format. The tools and the answer's JSON envelope are described in a system
  message, earlier calls become the assistant's envelopes, tool results user messages
  holding `{"tool_response": ...}`.

Each protocol gives the messages and template arguments to render, the grammar a job's
sampler enforces, and the `Reply` that reads the answer (worker/text/replies.py). With
`tool_choice` required or naming a tool the grammar admits only calls (of that tool), so the
call is well formed whatever the model; with "auto" the JSON envelope's grammar admits a call
or a `{"response": ...}`, and Hermes text is free until a call, which is then constrained
from its `<tool_call>` on (offered tools, their schemas, one call unless parallel:
worker/engine/grammar.py's TriggeredGate) and parsed. A `response_format` shapes the response in
both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from contract.jobspec import JobSpec, Message, Tool
from contract.schema import (
    Compiler,
    Grammar,
    composed,
    json_literal,
    json_object_grammar,
    literal,
    schema_grammar,
)
from worker.text.replies import GenericReply, HermesReply, PlainReply, Reply

PROBE_TOOL = "tokenspool_probe_tool"


class ToolProtocol(Protocol):
    name: str

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        """(messages for the template, each with a `content` string; more template arguments)."""
        ...

    def outside(self, spec: JobSpec) -> list[str]:
        """The client's strings this protocol renders outside message contents (tokenized
        with the template's special tokens: they must not hold a control token's text)."""
        ...

    def grammar(self, spec: JobSpec) -> str | None: ...

    def trigger(self, spec: JobSpec) -> str | None:
        """The text from whose first occurrence on `grammar` applies (None: from the start)."""
        ...

    def reply(self, spec: JobSpec) -> Reply: ...


def response_grammar(spec: JobSpec) -> str | None:
    """A job without tools: the response format's grammar, if it has one."""
    fmt = spec.response_format
    if fmt is None:
        return None
    return json_object_grammar() if fmt["type"] == "json_object" else schema_grammar(fmt["schema"])


def _response_rule(spec: JobSpec, g: Grammar) -> str:
    fmt = spec.response_format
    if fmt is None:
        return "string"
    if fmt["type"] == "json_object":
        return "object"
    return Compiler(fmt["schema"], g, prefix="response-").rule(fmt["schema"])


def _chosen(spec: JobSpec) -> list[Tool]:
    named = spec.named_tool
    return [t for t in spec.tools if named is None or t.name == named]


def _call_rule(spec: JobSpec, g: Grammar) -> str:
    """`{"name": NAME, "arguments": ARGS}` for each tool the job may call."""
    calls = []
    for i, tool in enumerate(_chosen(spec)):
        args = Compiler(tool.parameters, g, prefix=f"tool{i}-").rule(tool.parameters)
        calls.append(
            g.define(
                g.name(f"call-{i}"),
                f'"{{" ws {json_literal("name")} ws ":" ws {json_literal(tool.name)} ws "," ws '
                f'{json_literal("arguments")} ws ":" ws {args} "}}" ws',
            )
        )
    return g.define(g.name("call"), " | ".join(calls))


def _only_calls(spec: JobSpec) -> bool:
    return spec.tool_choice == "required" or spec.named_tool is not None


CALL_TAG = "<tool_call>"


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
        calls = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in m.tool_calls]
        body: dict = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
        return json.dumps(body, indent=2, ensure_ascii=False)

    def _instructions(self, spec: JobSpec) -> str:
        tools = [
            {"name": t.name, "description": t.description, "parameters": t.parameters} for t in _chosen(spec)
        ]
        call = '{"name": "<tool name>", "arguments": {<its arguments>}}'
        many = f'{{"tool_calls": [{call}, ...]}}'
        one = f'{{"tool_call": {call}}}'
        envelope = many if spec.parallel_tool_calls else one
        if _only_calls(spec):
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

    def outside(self, spec: JobSpec) -> list[str]:
        return []  # everything the client wrote is in a message's content

    def grammar(self, spec: JobSpec) -> str | None:
        if not spec.uses_tools:
            return response_grammar(spec)

        def build(g: Grammar) -> str:
            call = _call_rule(spec, g)
            if spec.parallel_tool_calls:
                many = f'"[" ws {call} ("," ws {call})* "]" ws'
                env = f'"{{" ws {json_literal("tool_calls")} ws ":" ws {many} "}}" ws'
            else:
                env = f'"{{" ws {json_literal("tool_call")} ws ":" ws {call} "}}" ws'
            calls = g.define(g.name("envelope"), env)
            if _only_calls(spec):
                return calls
            response = _response_rule(spec, g)
            answer = g.define(
                g.name("answer"), f'"{{" ws {json_literal("response")} ws ":" ws {response} "}}" ws'
            )
            return f"{calls} | {answer}"

        return composed(build)

    def trigger(self, spec: JobSpec) -> str | None:
        return None  # the envelope is constrained from its first token

    def reply(self, spec: JobSpec) -> Reply:
        return GenericReply(spec.id) if spec.uses_tools else PlainReply()


class HermesTools:
    name = "hermes"

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        out: list[dict] = []
        for m in spec.messages:
            msg: dict = {"role": m.role, "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                    }
                    for c in m.tool_calls
                ]
            if m.role == "tool":
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
        if not spec.uses_tools:
            return out, {}
        tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in _chosen(spec)
        ]
        return out, {"tools": tools}

    def outside(self, spec: JobSpec) -> list[str]:
        strings = []
        if spec.uses_tools:
            strings += [json.dumps(t.parameters, ensure_ascii=False) + t.description for t in spec.tools]
        for m in spec.messages:
            strings += [c.id + c.name + c.arguments for c in m.tool_calls] + [m.tool_call_id]
        return strings

    def grammar(self, spec: JobSpec) -> str | None:
        if not spec.uses_tools:
            return response_grammar(spec)

        def build(g: Grammar) -> str:
            call = _call_rule(spec, g)
            block = g.define(
                g.name("block"), f'{literal(CALL_TAG)} "\\n"? {call} "\\n"? {literal("</tool_call>")}'
            )
            blocks = f'{block} ("\\n" {block})*' if spec.parallel_tool_calls else block
            if self.trigger(spec):  # from the token holding the tag on (what it holds before it too)
                return f"[^<]* {blocks}"
            if _only_calls(spec):
                return blocks
            return f"{g.define(g.name('blocks'), blocks)} | {_response_rule(spec, g)}"

        return composed(build)

    def trigger(self, spec: JobSpec) -> str | None:
        """With "auto" and no response format the answer is free text until a call: the
        calls' grammar applies from the first `<tool_call>` on (only offered tools, their
        schemas, one call unless parallel_tool_calls, nothing after the calls)."""
        auto_text = spec.uses_tools and not _only_calls(spec) and spec.response_format is None
        return CALL_TAG if auto_text else None

    def reply(self, spec: JobSpec) -> Reply:
        return HermesReply(spec.id) if spec.uses_tools else PlainReply()


def _arguments(text: str) -> object:
    """A call's arguments as the template wants them: an object (a string that is not JSON
    stays a string)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def detect(render: Callable[..., str], template: str) -> ToolProtocol:
    """Hermes if the template renders a tool it is given and speaks `<tool_call>`; else JSON."""
    if "<tool_call>" not in template:
        return JsonTools()
    tool = {
        "type": "function",
        "function": {"name": PROBE_TOOL, "description": "", "parameters": {"type": "object"}},
    }
    try:
        text = render(messages=[{"role": "user", "content": "x"}], tools=[tool])
    except Exception:  # a template that cannot take tools: the JSON envelope works with any
        return JsonTools()
    return HermesTools() if PROBE_TOOL in text else JsonTools()
