"""`POST /v1/chat/completions`: its body, validated into a `JobSpec`. The legacy completions
share its base (api/endpoints/completions/body.py).

Every field either takes effect or is refused (api/http/parsing.py). A client asking for JSON
must not get prose. `null` for an optional field means "the default", as the official SDKs
may send it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field

from api.endpoints import images
from api.endpoints.body import (
    MAX_TOOLS,
    Body,
    Effort,
    Function,
    FunctionDef,
    Penalty,
    PositiveInt,
    SchemaFormat,
    SchemaName,
    StopString,
    Temperature,
    TopP,
    first_unanswered,
    template_kwargs,
)
from api.endpoints.structured import checked_choice, checked_format, checked_tools
from api.http.errors import invalid
from api.http.parsing import Strict, too_many, unsupported
from api.settings import Limits
from contract.jobspec import MAX_TOP_LOGPROBS, TEMPERATURE, TOP_P, JobSpec, Message, Tool, ToolCall
from contract.media.images import MARKER

MAX_LOGIT_BIAS = 300


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    # a data: URL (api/endpoints/images.py)
    url: str
    # low: shrunk first (docs/requests.md)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCallIn(Function):
    id: Annotated[str, Field(min_length=1)]
    function: FunctionCall


class _Message(Strict):
    """What every message has. `name` (a participant's name) is accepted and not rendered, as in
    llama-server. Chat templates have no place for it."""

    content: str | list[TextPart] | None = None
    name: str | None = None

    # only an assistant's message has them
    tool_calls: None = None
    # only a tool's message has one
    tool_call_id: None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else MARKER for part in self.content)


class SystemMessage(_Message):
    role: Literal["system", "developer"]


class UserMessage(_Message):
    role: Literal["user"]
    content: str | list[UserPart] | None = None  # type: ignore[assignment]  # images: a user's only


class AssistantMessage(_Message):
    role: Literal["assistant"]
    tool_calls: list[ToolCallIn] | None = None  # type: ignore[assignment]
    # What the server's own assistant messages carry, echoed back by SDK round trips.
    refusal: None = None
    function_call: None = None
    audio: None = None
    # a reasoning model's thinking, sent back by clients that keep it: its template renders it
    # where it wants it (Qwen3's in the current turn, gpt-oss's before a call) or leaves it out
    reasoning_content: str | None = None
    reasoning: str | None = None
    annotations: Annotated[list, Field(max_length=0)] | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    tool_call_id: str  # type: ignore[assignment]


# One model per role, as OpenAI's own schema has it: /openapi.json says which fields go with
# which role, and a field on the wrong role is named in the 400.
ChatMessage = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


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


class CompletionBody(Body):
    """What the two completion endpoints' bodies (chat, legacy text) share."""

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
    # llama-server's extension: generate exactly max_tokens
    ignore_eos: bool | None = None

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
            "temperature": TEMPERATURE if self.temperature is None else float(self.temperature),
            "top_p": TOP_P if self.top_p is None else float(self.top_p),
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


class ChatRequest(CompletionBody):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    reasoning_effort: Effort | None = None
    chat_template_kwargs: dict[str, bool | int | float | str] | None = None
    # a reasoning model's thinking is closed by the worker after this many tokens (Qwen's name)
    thinking_budget: PositiveInt | None = None

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
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
        self._read_images(limits)
        return JobSpec(
            id=job_id,
            kind="chat",
            model=self.model,
            messages=tuple(self._message(m) for m in self.messages),
            images=tuple(image.sha256 for image in self._images),
            low_detail=images.low_detail(self._images),
            # opencode (the AI SDK) asks 32,000: as on the Messages API, the limit (or the context) ends it
            max_tokens=min(
                self.max_completion_tokens or self.max_tokens or limits.max_tokens, limits.max_tokens
            ),
            **self._sampling(),
            logprobs=bool(self.logprobs),
            top_logprobs=self.top_logprobs or 0,
            response_format=fmt,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=True if self.parallel_tool_calls is None else self.parallel_tool_calls,
            priority=self.priority,
            template_kwargs=template_kwargs(
                self.reasoning_effort, self.chat_template_kwargs, "chat_template_kwargs"
            ),
            thinking_budget=self.thinking_budget or 0,
        )

    @staticmethod
    def _message(m: SystemMessage | UserMessage | AssistantMessage | ToolMessage) -> Message:
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
        role = "system" if m.role == "developer" else m.role
        job_id = m.tool_call_id if isinstance(m, ToolMessage) else ""
        thought = (m.reasoning_content or m.reasoning or "") if isinstance(m, AssistantMessage) else ""
        return Message(role=role, content=m.text(), tool_calls=calls, tool_call_id=job_id, reasoning=thought)

    def image_urls(self) -> list[tuple[str, str]]:
        return [
            (part.image_url.url, f"messages[{i}].content[{j}].image_url.url")
            for i, m in enumerate(self.messages)
            if isinstance(m.content, list)
            for j, part in enumerate(m.content)
            if isinstance(part, ImagePart)
        ]

    def _read_images(self, limits: Limits) -> None:
        """The request's images, each checked (api/endpoints/images.py), into `images`. Where there
        are any, no text of the request may hold the image marker."""
        found, texts = [], []
        for i, m in enumerate(self.messages):
            parts = m.content if isinstance(m.content, list) else [m.content or ""]
            for j, part in enumerate(parts):
                at = f"messages[{i}].content" + (f"[{j}]" if isinstance(m.content, list) else "")
                if isinstance(part, ImagePart):
                    url = part.image_url.url
                    image = images.read(url, f"{at}.image_url.url", limits, self._fetched)
                    found.append(image.at(part.image_url.detail))
                    images.counted(found, at, limits)
                    self._image_params.append(at)
                else:
                    texts.append((part if isinstance(part, str) else part.text, at))
        if found:
            for text, at in texts:
                images.no_marker(text, at)
        self._images = found

    def _check_conversation(self) -> None:
        i = first_unanswered(self._message(m) for m in self.messages)
        if i is not None:
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
        """None: a max_tokens above MAX_TOKENS_LIMIT is clamped to it (`to_spec`), not refused."""
        return None, "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def enforce(self, limits: Limits) -> None:
        if len(self.messages) > limits.max_messages:
            raise too_many("messages", limits.max_messages, len(self.messages))
        super().enforce(limits)
