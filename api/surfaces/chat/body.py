"""Request bodies of the endpoints that create jobs, validated into a `JobSpec`.

Pydantic models in strict mode (a string where a number belongs is an error, not coerced).
Every field either takes effect or is refused: a field this server does not implement is a
400 `unsupported_parameter` naming it, never silently dropped (a client asking for JSON must
not get prose). The exceptions change nothing here by their nature and are accepted:
`user`, `metadata`, `store` (README). `null` for an optional field means "the default", as
the official SDKs may send it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from api.http.errors import APIError, invalid
from api.settings import Limits
from api.surfaces.structured import checked_choice, checked_format, checked_tools
from contract.errors import ARRAY_TOO_LONG, BAD_REQUEST, MISSING_PARAMETER, STRING_TOO_LONG, UNSUPPORTED
from contract.jobspec import MAX_TOP_LOGPROBS, JobSpec, Message, Tool, ToolCall

MAX_TOOLS = 128  # OpenAI's limit
MAX_LOGIT_BIAS = 300
B = TypeVar("B", bound="Body")


class Strict(BaseModel):
    """Every request model: JSON types exactly (no "1" for 1), and no field it does not declare
    (a field this server does not implement is a 400 naming it, never silently dropped)."""

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


class Function(Strict):
    """What names a function in a request: `{"type": "function", ...}`."""

    type: Literal["function"]


class SchemaFormat(Strict):
    """What a json_schema output format says besides its name (chat and Responses)."""

    description: str | None = None
    schema_: Annotated[dict | None, Field(alias="schema")] = None
    strict: bool | None = None  # the schema is always enforced


SchemaName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Field(ge=1)]
StopString = Annotated[str, Field(min_length=1)]


class TextPart(Strict):
    type: Literal["text"]
    text: str


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCallIn(Function):
    id: Annotated[str, Field(min_length=1)]
    function: FunctionCall


class _Message(Strict):
    """What every message has. `name` (a participant's name) is accepted and not rendered:
    chat templates have no place for it (as in llama-server)."""

    content: str | list[TextPart] | None = None
    name: str | None = None

    tool_calls: None = None  # only an assistant's message has them
    tool_call_id: None = None  # only a tool's message has one

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SystemMessage(_Message):
    role: Literal["system", "developer"]


class UserMessage(_Message):
    role: Literal["user"]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    tool_calls: list[ToolCallIn] | None = None  # type: ignore[assignment]
    # What the server's own assistant messages carry, echoed back by SDK round trips.
    refusal: None = None
    function_call: None = None
    audio: None = None
    annotations: Annotated[list, Field(max_length=0)] | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    tool_call_id: str  # type: ignore[assignment]


# One model per role, as OpenAI's own schema has it: /openapi.json says which fields go with
# which role, and a field on the wrong role is named in the 400.
ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # the schema is always enforced


class ToolDef(Function):
    function: FunctionDef


class NamedFunction(Strict):
    name: str


class NamedTool(Function):
    function: NamedFunction


class JsonSchemaFormat(SchemaFormat):
    name: SchemaName


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def rules(self) -> dict[str, bool]:
        return {
            "response_format: json_schema goes with type json_schema, and only with it": (
                (self.type == "json_schema") == (self.json_schema is not None)
            )
        }


class StreamOptions(Strict):
    include_usage: bool | None = None


class Body(Strict):
    """What every body that creates a job has; each surface's body says how it becomes a job
    (`to_spec`), what else its job records (`job_fields`) and what of it the request limits
    measure."""

    model: Annotated[str, Field(min_length=1)]
    stream: bool | None = None
    background: bool | None = None
    # The queue tier (contract.keys.PRIORITIES): workers take `priority` jobs first, `flex` last.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    # Accepted, and change nothing here (see the module docstring).
    user: str | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    store: bool | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return False

    @property
    def priority(self) -> str:
        return "default" if self.service_tier in (None, "auto") else self.service_tier

    def to_spec(self, completion_id: str, limits: Limits) -> JobSpec:
        """The job, with every default applied (a completion is never unbounded: without a
        max_tokens it stops at MAX_TOKENS_LIMIT, or when the context is full)."""
        raise NotImplementedError

    def job_fields(self, completion_id: str) -> dict[str, str]:
        """What the job's hash records beside the spec, for the surface to show later."""
        return {}

    def prompt_chars(self) -> tuple[int, str]:
        """(characters of prompt, the parameter that holds them)."""
        raise NotImplementedError

    def wanted_tokens(self) -> tuple[int | None, str]:
        """(completion tokens asked for, the parameter that asks)."""
        raise NotImplementedError

    def stops(self) -> list[str]:
        return []

    def enforce(self, limits: Limits) -> None:
        """Raise an OpenAI-style 400 for the first limit the request exceeds."""
        chars, param = self.prompt_chars()
        if chars > limits.max_prompt_chars:
            raise invalid(
                f"Invalid '{param}': the prompt is {chars} characters long; the limit is "
                f"{limits.max_prompt_chars}.",
                param=param,
                error=STRING_TOO_LONG,
            )
        wanted, wanted_param = self.wanted_tokens()
        if wanted is not None and wanted > limits.max_tokens:
            raise invalid(
                f"{wanted_param} is too large: {wanted}. This server allows at most {limits.max_tokens} "
                "completion tokens.",
                param=wanted_param,
            )
        stop = self.stops()
        if len(stop) > limits.max_stop:
            raise too_many("stop", limits.max_stop, len(stop))
        if any(len(s) > limits.max_stop_chars for s in stop):
            raise invalid(
                f"Invalid 'stop': each stop sequence may be at most {limits.max_stop_chars} characters.",
                param="stop",
                error=STRING_TOO_LONG,
            )


class CompletionBody(Body):
    """What the two completion surfaces' bodies (chat, legacy text) share."""

    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: int | None = None
    stream_options: StreamOptions | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repeat_penalty: Annotated[float, Field(ge=0.01, le=10.0)] | None = None
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)]
        | None
    ) = None
    ignore_eos: bool | None = None  # llama-server's extension: generate exactly max_tokens

    def rules(self) -> dict[str, bool]:
        return {
            "n: only n=1 is supported": self.n in (None, 1),
            "stream_options: only allowed when stream or background is true": (
                self.stream_options is None or bool(self.stream or self.background)
            ),
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def wanted_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    def stops(self) -> list[str]:
        return self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []

    def _sampling(self) -> dict:
        return {
            "temperature": 1.0 if self.temperature is None else float(self.temperature),
            "top_p": 1.0 if self.top_p is None else float(self.top_p),
            "stop": tuple(self.stops()),
            "seed": self.seed,
            "presence_penalty": float(self.presence_penalty or 0.0),
            "frequency_penalty": float(self.frequency_penalty or 0.0),
            "top_k": self.top_k or 0,
            "min_p": float(self.min_p or 0.0),
            "repeat_penalty": 1.0 if self.repeat_penalty is None else float(self.repeat_penalty),
            "logit_bias": _logit_bias(self.logit_bias),
            "ignore_eos": bool(self.ignore_eos),
        }


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's `{"token id": bias}` as (id, bias) pairs, ids ascending."""
    pairs = []
    for key, value in (bias or {}).items():
        if not key.isdigit() or len(key) > 9:
            raise invalid(f"Invalid 'logit_bias': {key[:32]!r} is not a token id.", param="logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def too_many(param: str, limit: int, got: int) -> APIError:
    return invalid(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, "
        f"but got an array with length {got} instead.",
        param=param,
        error=ARRAY_TOO_LONG,
    )


class ChatRequest(CompletionBody):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def to_spec(self, completion_id: str, limits: Limits) -> JobSpec:
        self._check_conversation()
        tools = self._tools()
        fmt = self._format()
        if self.top_logprobs and not self.logprobs:
            raise invalid("Invalid 'top_logprobs': it needs logprobs set to true.", param="top_logprobs")
        choice = self._tool_choice(tools)
        if self.logprobs and tools and choice != "none":
            raise unsupported("logprobs", "logprobs cannot be combined with tools on this server.")
        if self.ignore_eos and (fmt or (tools and choice != "none")):
            raise invalid(
                "Invalid 'ignore_eos': a response format or tools end where their grammar does, so "
                "it cannot go with them.",
                param="ignore_eos",
            )
        return JobSpec(
            id=completion_id,
            kind="chat",
            model=self.model,
            messages=tuple(self._message(m) for m in self.messages),
            max_tokens=self.max_completion_tokens or self.max_tokens or limits.max_tokens,
            **self._sampling(),
            logprobs=bool(self.logprobs),
            top_logprobs=self.top_logprobs or 0,
            response_format=fmt,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=True if self.parallel_tool_calls is None else self.parallel_tool_calls,
            priority=self.priority,
        )

    @staticmethod
    def _message(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> Message:
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
        role = "system" if m.role == "developer" else m.role
        cid = m.tool_call_id if isinstance(m, ToolMessage) else ""
        return Message(role=role, content=m.text(), tool_calls=calls, tool_call_id=cid)

    def _check_conversation(self) -> None:
        """OpenAI's rules: only assistants call tools, and a tool result answers a call made
        before it."""
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            calls.update(c.id for c in m.tool_calls or ())
            if isinstance(m, ToolMessage) and m.tool_call_id not in calls:
                raise invalid(
                    f"Invalid 'messages[{i}]': a message with role 'tool' must answer a tool call "
                    "of an earlier assistant message ('tool_call_id' names none).",
                    param=f"messages[{i}].tool_call_id",
                )

    def _tools(self) -> tuple[Tool, ...]:
        defs = [(t.function.name, t.function.description, t.function.parameters) for t in self.tools or ()]
        return checked_tools(defs, "tools[{}].function")

    def _tool_choice(self, tools: tuple[Tool, ...]) -> str:
        choice = self.tool_choice
        if isinstance(choice, NamedTool):
            return checked_choice(choice.function.name, tools, "tool_choice.function.name")
        return checked_choice(choice, tools)

    def _format(self) -> dict | None:
        fmt = self.response_format
        if fmt is None or fmt.json_schema is None:
            return checked_format(fmt.type if fmt else "text", None, "response_format")
        return checked_format(fmt.type, fmt.json_schema.schema_, "response_format.json_schema.schema")

    def prompt_chars(self) -> tuple[int, str]:
        chars = sum(len(m.text()) for m in self.messages)
        chars += sum(len(c.function.arguments) for m in self.messages for c in m.tool_calls or ())
        chars += sum(len(json.dumps(t.model_dump(by_alias=True))) for t in self.tools or ())
        return chars, "messages"

    def wanted_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def enforce(self, limits: Limits) -> None:
        if len(self.messages) > limits.max_messages:
            raise too_many("messages", limits.max_messages, len(self.messages))
        super().enforce(limits)


def unsupported(param: str, why: str) -> APIError:
    return invalid(f"Unsupported parameter: '{param}'. {why}", param=param, error=UNSUPPORTED)


class CompletionRequest(CompletionBody):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # the legacy shape: how many alternatives

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def to_spec(self, completion_id: str, limits: Limits) -> JobSpec:
        return JobSpec(
            id=completion_id,
            kind="text",
            model=self.model,
            prompt=self.text(),
            max_tokens=16 if self.max_tokens is None else self.max_tokens,  # OpenAI's default
            **self._sampling(),
            logprobs=self.logprobs is not None,
            top_logprobs=self.logprobs or 0,
            priority=self.priority,
        )

    def prompt_chars(self) -> tuple[int, str]:
        return len(self.text()), "prompt"


def parse(body_type: type[B], body: bytes) -> B:
    """Raw body -> request model, or an APIError saying precisely what is wrong."""
    try:
        data = json.loads(body)
    except ValueError as exc:  # not UTF-8, not JSON, or an integer of over 4,300 digits
        raise invalid(f"We could not parse the JSON body of your request: {exc}", error=BAD_REQUEST) from None
    except RecursionError:  # nested deeper than the parser's recursion: no request is
        raise invalid("The JSON body of your request is nested too deeply.", error=BAD_REQUEST) from None
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.", error=BAD_REQUEST)
    try:
        return body_type.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc) from None
    except RecursionError:
        raise invalid("The JSON body of your request is nested too deeply.", error=BAD_REQUEST) from None


def _explain(exc: ValidationError) -> APIError:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not _is_type_tag(str(p))]
    if len(loc) > 2 and loc[0] == "messages" and loc[1].isdigit():
        del loc[2]  # the role that chose the message's model
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # the role
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
