"""Tools and response formats as a job takes them.

They are checked the same way for every endpoint that offers them (chat, Responses). Names
and choices are checked. Every schema is compiled to a grammar here first. So what the
grammar cannot enforce is a 400 naming where, not a worker's failure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from api.http.errors import invalid
from contract.freeform.escaped import check_format
from contract.freeform.terms import FormatError
from contract.gbnf import SchemaError
from contract.jobspec import NAMED, TOOL_NAME, Tool
from contract.schema import check_size, schema_grammar


def checked_tools(
    defs: list[tuple[str, str | None, dict | None]],
    where: str,
    schema_field: str = "parameters",
    at: Sequence[int] | None = None,
) -> tuple[Tool, ...]:
    """(name, description, parameters) of each function tool, checked and compiled. `where` names a
    tool's parameter: `where.format(index)`, with the index `at` gives or its own. `schema_field` is
    the name of its schema's field (the Messages API's `input_schema`)."""
    tools = []
    for i, (name, description, parameters) in enumerate(defs):
        param = where.format(at[i] if at is not None else i)
        if not TOOL_NAME.fullmatch(name):
            raise invalid(
                f"Invalid '{param}.name': {name[:64]!r} must be 1 to 64 letters, digits, "
                "underscores or dashes.",
                param=f"{param}.name",
            )
        parameters = parameters if parameters is not None else {"type": "object", "properties": {}}
        _compile(parameters, f"{param}.{schema_field}")
        tools.append(Tool(name, description or "", parameters))
    if len({t.name for t in tools}) != len(tools):
        raise invalid("Invalid 'tools': function names must be unique.", param="tools")
    return tuple(tools)


def checked_choice(
    choice: str | None, tools: tuple[Tool, ...], named_param: str = "", custom: bool = False
) -> str:
    """The job's tool choice: "auto" by default, a mode, or a named tool. A named tool is NAMED +
    the name of one of `tools`. It comes with `named_param`, where the request names it. The tool is
    a function, or a custom one with `custom`."""
    if choice is None:
        return "auto"
    if not tools:
        raise invalid(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    if named_param:
        if choice not in {t.name for t in tools if (t.freeform is not None) == custom}:
            kind = "custom tool" if custom else "tool"
            raise invalid(f"Invalid 'tool_choice': no {kind} named {choice[:64]!r}.", param=named_param)
        return NAMED + choice
    return choice


def checked_custom(tool: Tool, fmt: dict, param: str) -> Tool:
    """A custom tool as the job takes it, its format compiled. What its grammar cannot enforce is a
    400 naming `param`. Its description tells the model what its one argument, `input`, holds."""
    try:
        check_format(fmt)
    except FormatError as exc:
        raise invalid(f"Invalid '{param}': {exc}.", param=param) from None
    if fmt["type"] == "text":
        told = "Its argument `input` is free text."
    else:
        syntax = "Lark grammar" if fmt["syntax"] == "lark" else "regular expression"
        told = f"Its argument `input` is text matching this {syntax}:\n{fmt['definition']}"
    description = f"{tool.description}\n\n{told}" if tool.description else told
    return dataclasses.replace(tool, description=description, freeform=fmt)


def checked_format(kind: str, schema: dict | None, param: str) -> dict | None:
    """The job's response format: None for text, else JSON (any object, or `schema`'s)."""
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    schema = schema if schema is not None else {"type": "object"}
    _compile(schema, param)
    return {"type": "json_schema", "schema": schema}


def _compile(schema: object, param: str) -> None:
    """A 400 naming where in the schema, and which keyword, the grammar cannot enforce."""
    try:
        check_size(schema)
        schema_grammar(schema)
    except SchemaError as exc:
        raise invalid(f"Invalid '{param}': {exc}.", param=param) from None
    except RecursionError:
        raise invalid(f"Invalid '{param}': the schema is nested too deeply.", param=param) from None
