"""What every tool protocol builds its grammar from. It holds the rule of a call of each tool
the job may call. It holds the response format's rule too. It also gives a call's arguments as
a template takes them."""

from __future__ import annotations

import json

from contract.freeform.escaped import string_rule
from contract.gbnf import Grammar, json_literal, json_object_grammar
from contract.jobspec import JobSpec, Tool
from contract.schema import Compiler, schema_grammar


def response_grammar(spec: JobSpec) -> str | None:
    """A job without tools: the response format's grammar, if it has one."""
    fmt = spec.response_format
    if fmt is None:
        return None
    return json_object_grammar() if fmt["type"] == "json_object" else schema_grammar(fmt["schema"])


def response_rule(spec: JobSpec, g: Grammar) -> str:
    fmt = spec.response_format
    if fmt is None:
        return "string"
    if fmt["type"] == "json_object":
        return "object"
    return Compiler(fmt["schema"], g, prefix="response-").rule(fmt["schema"])


def chosen(spec: JobSpec) -> list[Tool]:
    named = spec.named_tool
    return [t for t in spec.tools if named is None or t.name == named]


def call_rule(spec: JobSpec, g: Grammar) -> str:
    """`{"name": NAME, "arguments": ARGS}` for each tool the job may call."""
    calls = []
    for i, tool in enumerate(chosen(spec)):
        args = arguments_rule(tool, g, i)
        calls.append(
            g.define(
                g.name(f"call-{i}"),
                f'"{{" ws {json_literal("name")} ws ":" ws {json_literal(tool.name)} ws "," ws '
                f'{json_literal("arguments")} ws ":" ws {args} "}}" ws',
            )
        )
    return g.define(g.name("call"), " | ".join(calls))


def arguments_rule(tool: Tool, g: Grammar, i: int) -> str:
    """A call's arguments: its schema's, or a custom tool's `{"input": TEXT}`. TEXT is the JSON
    string of a text its format's grammar takes (contract/freeform/)."""
    if tool.freeform is None:
        return Compiler(tool.parameters, g, prefix=f"tool{i}-").rule(tool.parameters)
    text = string_rule(tool.freeform, g, f"tool{i}-")
    body = f'"{{" ws {json_literal("input")} ws ":" ws {text} "}}" ws'
    return g.define(g.name(f"tool{i}-arguments"), body)


def only_calls(spec: JobSpec) -> bool:
    return spec.tool_choice == "required" or spec.named_tool is not None


def arguments_value(text: str) -> object:
    """A call's arguments as the template wants them: an object. A string that is not JSON
    stays a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text
