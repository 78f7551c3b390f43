"""The Responses API's tools beyond a plain function.

They are a `namespace` of functions, and OpenAI's built-in tools, which this server does not
run. Codex sends its sub-agents' and MCP servers' tools as namespaces.

A namespace's functions are offered to the model flattened. Each goes under one name made of
the namespace's and its own (`flat_name`: `multi_agent_v1__spawn_agent`). A call the model
makes comes back as OpenAI has it: the function's own `name` beside its `namespace`. That is
how Codex finds the tool it runs. The Response's `tools` repeats what was offered, a namespace
as it was sent.

A built-in tool is never offered to the model. This server would have nothing to run a call
to it with. Those tools (`HOSTED`) are web search, file search, code interpreter and image
generation. So are a computer, a remote MCP server, a shell... HOSTED_TOOLS says what a
request naming one gets. With `omit`, the default, the tool is left out. The default is so
that Codex's default config works: it sends `web_search`. The Response's `tools` then lists
only the tools offered, and the `x-omitted-tools` header names those left out. With `refuse`,
the request is a 400 naming the tool.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from api.endpoints.body import FunctionDef
from api.endpoints.responses.tools import CustomTool
from api.http.errors import APIError, invalid
from api.http.parsing import Strict
from contract.errors import UNSUPPORTED
from contract.jobspec import TOOL_NAME

HOSTED = (
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer",
    "computer_use_preview",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
)
"""OpenAI's built-in tool types: OpenAI runs them, or (a shell, a patch) the client does when
the model writes OpenAI's own call items for them, which no model here writes."""

FLAT_SEPARATOR = "__"


class HostedTool(Strict):
    """A built-in tool: whatever it configures is never used (it is never offered)."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: Literal[HOSTED]  # type: ignore[valid-type]


class FunctionTool(FunctionDef):
    """The Responses API's function tool (alone or in a namespace): chat's function
    definition, flattened."""

    type: Literal["function"]
    # deferred for OpenAI's tool search (a built-in tool): with no search here it is offered
    defer_loading: bool | None = None


class NamespaceTool(Strict):
    """Functions grouped under a namespace's name (openai-python's `NamespaceTool`)."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: Annotated[list[FunctionTool], Field(min_length=1)]


def flat_name(namespace: str, name: str) -> str:
    """The one name the model sees for function `name` of `namespace`: the two joined by `__`. They
    are joined by one `__` only. A namespace ending in `__`, as Codex's `mcp__<server>__` may, is
    joined as it is. A name over 64 characters keeps its head and ends in a digest of both."""
    joined = namespace + name if namespace.endswith(FLAT_SEPARATOR) else namespace + FLAT_SEPARATOR + name
    if len(joined) <= 64:
        return joined
    digest = hashlib.blake2b(f"{namespace}\n{name}".encode(), digest_size=4).hexdigest()
    return f"{joined[:55]}_{digest}"


def offered(tools: list, param: str = "tools") -> list[tuple[str, str | None, dict | None, str, object]]:
    """(name the model sees, description, parameters, where in the request, the tool sent) of each
    function offered. The functions offered are the plain ones and every namespace's, flattened.
    Each custom tool is offered too, as a function of one string (api/endpoints/responses/tools.py).
    Built-in tools are not."""
    out: list[tuple[str, str | None, dict | None, str, object]] = []
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if isinstance(tool, NamespaceTool):
            _check_name(tool.name, f"{where}.name")
            for j, f in enumerate(tool.tools):
                _check_name(f.name, f"{where}.tools[{j}].name")
                out.append(
                    (flat_name(tool.name, f.name), f.description, f.parameters, f"{where}.tools[{j}]", f)
                )
        elif not isinstance(tool, HostedTool):
            out.append((tool.name, tool.description, tool.parameters, where, tool))
    return out


def namespaces(tools: list) -> dict[str, list[str]]:
    """Flattened name -> [namespace, function] of every namespaced function. It is how a call the
    model makes is told back (api/endpoints/responses/objects.py)."""
    return {
        flat_name(t.name, f.name): [t.name, f.name]
        for t in tools
        if isinstance(t, NamespaceTool)
        for f in t.tools
    }


def omitted(tools: list) -> list[str]:
    """The built-in tools' types, in the order sent (each left out, or refused)."""
    return [t.type for t in tools if isinstance(t, HostedTool)]


def refuse_hosted(tools: list, param: str = "tools") -> None:
    """HOSTED_TOOLS=refuse: a 400 naming the first built-in tool."""
    for i, tool in enumerate(tools):
        if isinstance(tool, HostedTool):
            raise APIError(
                UNSUPPORTED,
                f"Unsupported parameter: '{param}[{i}].type'. This server does not run the "
                f"built-in tool {tool.type!r} (HOSTED_TOOLS=refuse).",
                param=f"{param}[{i}].type",
            )


def echoed(tools: list) -> list[dict]:
    """The tools as the Response repeats them. Those are the tools offered, each in the shape it was sent."""
    out: list[dict] = []
    for tool in tools:
        if isinstance(tool, NamespaceTool):
            about = tool.description or ""
            functions = [_function(f) for f in tool.tools]
            out.append({"type": "namespace", "name": tool.name, "description": about, "tools": functions})
        elif isinstance(tool, CustomTool):
            out.append(tool.echoed())
        elif not isinstance(tool, HostedTool):
            out.append(_function(tool))
    return out


def _function(tool: FunctionDef) -> dict:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": True,
    }


def _check_name(name: str, param: str) -> None:
    if not TOOL_NAME.fullmatch(name):
        raise invalid(
            f"Invalid '{param}': {name[:64]!r} must be 1 to 64 letters, digits, underscores or dashes.",
            param=param,
        )
