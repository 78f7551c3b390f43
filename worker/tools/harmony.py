"""The harmony protocol, for gpt-oss's templates. The template renders `tools` itself, as a
`functions` namespace in the developer message. It renders earlier calls as `commentary`
messages to `functions.<name>`, and tool results as messages from them. The model calls a tool
with such a message, which worker/text/harmony.py reads.

Grammars hold from where the thinking ends. A response format is the `final` message's body,
from its header on. That header is a trigger: the model writes it itself, or a thinking budget
writes it. With `tool_choice` required or naming a tool, the answer must be a call. So the
grammar holds from the first token. The analysis message comes first and is free (as
llama.cpp's lazy grammars leave it). Then comes a `commentary` header naming an offered tool,
and its arguments' JSON. With "auto" the model calls as it was trained to, unconstrained.
"""

from __future__ import annotations

import json

from contract.gbnf import Grammar, composed, literal
from contract.jobspec import JobSpec
from worker.text import harmony
from worker.text.replies import PlainReply, Reply
from worker.tools.call_rules import arguments_rule, chosen, only_calls, response_rule
from worker.tools.hermes import HermesTools

# the answer's header, from its channel on
FINAL = f"{harmony.CHANNEL}final"


class HarmonyTools(HermesTools):
    """The conversation and tools go to the template as Hermes's do (OpenAI's shapes)."""

    name = "harmony"
    # gpt-oss's template renders it before a call of the same turn
    reasoning_key = "thinking"

    def grammar(self, spec: JobSpec, opened: str | None = None) -> str | None:
        if only_calls(spec):
            return composed(lambda g: _calls(spec, g, opened))
        if spec.response_format is None:
            return None
        # the header as gpt-oss may write it: `final<|message|>` or `final <|constrain|>json<|message|>`
        constrain = f'(" " {literal(harmony.CONSTRAIN)}? [A-Za-z0-9_-]+)?'
        return composed(
            lambda g: f"{literal(FINAL)} {constrain} {literal(harmony.MESSAGE)} {response_rule(spec, g)}"
        )

    def trigger(self, spec: JobSpec) -> str | None:
        return None if only_calls(spec) or spec.response_format is None else FINAL

    def messages(self, spec: JobSpec) -> tuple[list[dict], dict]:
        """Hermes's, but a tool result's content is escaped as a JSON string's inside. The
        gpt-oss template puts it between quotes (`|tojson` of the content, a placeholder here)."""
        out, extra = super().messages(spec)
        for msg in out:
            if msg["role"] == "tool" and msg["content"]:
                msg["content"] = json.dumps(msg["content"], ensure_ascii=False)[1:-1]
        return out, extra

    def reader(self, spec: JobSpec, reply: Reply, opened: str | None) -> harmony.Harmony:
        """The harmony reply around `reply`, its calls limited to the tools offered."""
        offered = frozenset(t.name for t in chosen(spec)) if spec.uses_tools else frozenset()
        return harmony.Harmony(reply, spec.id, opened, offered)

    def reply(self, spec: JobSpec) -> Reply:
        # the calls are harmony messages: worker/text/harmony.py reads them
        return PlainReply()


def _calls(spec: JobSpec, g: Grammar, opened: str | None) -> str:
    """A call of one of the offered tools, after the thinking. The thinking is a message the
    prompt left open, or one the model may write first."""
    calls = []
    for i, tool in enumerate(chosen(spec)):
        args = arguments_rule(tool, g, i)
        header = (
            f"{harmony.CHANNEL}commentary to=functions.{tool.name} {harmony.CONSTRAIN}json{harmony.MESSAGE}"
        )
        calls.append(g.define(g.name(f"call-{i}"), f"{literal(header)} {args}"))
    call = g.define(g.name("call"), " | ".join(calls))
    # <|end|>: if it is text
    start = f"{literal(harmony.END)}? {literal(harmony.START + 'assistant')}"
    if opened == "analysis":
        return f"[^<]* {start} {call}"
    thinking = literal(f"{harmony.CHANNEL}analysis{harmony.MESSAGE}")
    return f"({thinking} [^<]* {start})? {call}"
