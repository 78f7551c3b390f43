"""Request bodies as strict models. The module holds the base every body is built on, and
parses raw bytes into one. It translates pydantic's errors into OpenAI's: a 400 naming the
parameter.

Strict mode: a string where a number belongs is an error, not coerced. A field the model
does not declare is a 400 `unsupported_parameter` naming it, never silently dropped.
"""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from api.http.errors import APIError, invalid
from contract.errors import ARRAY_TOO_LONG, BAD_REQUEST, MISSING_PARAMETER, UNSUPPORTED

B = TypeVar("B", bound="Strict")


class Strict(BaseModel):
    """Every request model: JSON types exactly (no "1" for 1), and no field it does not
    declare. A field this server does not implement is a 400 naming it, never silently
    dropped."""

    model_config = ConfigDict(strict=True, extra="forbid")

    def rules(self) -> dict[str, bool]:
        """The rules across fields a valid body keeps: "<field>: <why>" -> whether it holds."""
        return {}

    @model_validator(mode="after")
    def _keeps_its_rules(self):
        for message, holds in self.rules().items():
            if not holds:
                raise ValueError(message)
        return self


def unsupported(param: str, why: str) -> APIError:
    return invalid(f"Unsupported parameter: '{param}'. {why}", param=param, error=UNSUPPORTED)


def too_many(param: str, limit: int, got: int) -> APIError:
    return invalid(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, "
        f"but got an array with length {got} instead.",
        param=param,
        error=ARRAY_TOO_LONG,
    )


def parse(body_type: type[B], body: bytes) -> B:
    """Raw body -> request model, or an APIError saying precisely what is wrong."""
    try:
        data = json.loads(body)
    # not UTF-8, not JSON, or an integer of over 4,300 digits
    except ValueError as exc:
        raise invalid(f"We could not parse the JSON body of your request: {exc}", error=BAD_REQUEST) from None
    # nested deeper than the parser's recursion: no request is
    except RecursionError:
        raise invalid("The JSON body of your request is nested too deeply.", error=BAD_REQUEST) from None
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.", error=BAD_REQUEST)
    try:
        return body_type.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc, data) from None
    except RecursionError:
        raise invalid("The JSON body of your request is nested too deeply.", error=BAD_REQUEST) from None


def _explain(exc: ValidationError, data: dict) -> APIError:
    """The error to name: the one that reached deepest into the body. Of a union's branches,
    it is the one the body meant. That is a list of parts, say, rather than "not a
    string"."""
    found = [(e, _located(e["loc"], data)) for e in exc.errors()]
    err, loc = max(found, key=lambda pair: len(pair[1]))
    if len(loc) > 2 and loc[0] == "messages" and loc[1].isdigit() and loc[2] in _ROLES:
        # the role that chose the message's model
        del loc[2]
    msg = err["msg"].removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    # a block's type
    if err["type"] == "union_tag_invalid" and "role" not in str(ctx.get("discriminator")):
        param = _param([*loc, "type"])
        return invalid(
            f"Invalid '{param}': {str(ctx.get('tag'))[:64]!r} is not one of {ctx.get('expected_tags')}.",
            param=param,
        )
    # the role
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("role")
        if err["type"] == "union_tag_not_found":
            err = {**err, "type": "missing"}
        else:
            msg = "role must be one of 'system', 'developer', 'user', 'assistant', 'tool'"
    if err["type"] == "value_error" and ":" in msg:
        param, _, msg = msg.partition(": ")
        return invalid(f"Invalid '{param}': {msg}.", param=param, error=BAD_REQUEST)
    param = _param(loc) or None
    if err["type"] == "extra_forbidden":
        return unsupported(param or "", "This server does not implement it (README lists what it does).")
    if err["type"] == "none_required" and param and param.endswith((".tool_calls", ".tool_call_id")):
        field = param.rsplit(".", 1)[1]
        owner = "assistant" if field == "tool_calls" else "tool"
        return invalid(f"Invalid '{param}': only {owner} messages have '{field}'.", param=param)
    if err["type"] == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param=param, error=MISSING_PARAMETER)
    return invalid(f"Invalid '{param}': {msg}.", param=param)


def _located(raw: tuple, data: object) -> list[str]:
    """Pydantic's error location as the body's own path. It drops the names of union members
    ('str', 'list[...]'). It also drops the tags that chose one (a block's `type`, a
    message's `role`). They are found by walking the body beside it."""
    out: list[str] = []
    node, tag_used = data, False
    parts = [str(p) for p in raw if not _is_type_tag(str(p))]
    for at, part in enumerate(parts):
        # a tag is followed by the field it found at fault
        last = at == len(parts) - 1
        if isinstance(node, dict) and part not in node and not (tag_used or last) and part in _tags(node):
            tag_used = True
            continue
        out.append(part)
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, tag_used = node[int(part)], False
        elif isinstance(node, dict) and part in node:
            node, tag_used = node[part], False
        else:
            node = None
    return out


def _tags(node: dict) -> tuple:
    """What may choose a union member for this object: its `type` or `role`. An input item
    without a type is a message."""
    return (node.get("type", "message"), node.get("role"))


# chat's message models, by role
_ROLES = ("system", "developer", "user", "assistant", "tool")


def _param(loc: list[str]) -> str:
    """Pydantic's location as OpenAI names a parameter: `messages[0].content`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _is_type_tag(part: str) -> bool:
    """Pydantic names union members in error locations ('str', 'list[...]'): not params."""
    return (
        part in {"str", "int", "float", "bool", "none"}
        or "[" in part
        or part.startswith(("function-", "constrained-"))
    )
