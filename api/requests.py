"""Request bodies of the completion endpoints, validated into a `JobSpec`.

Pydantic models in strict mode (a string where a number belongs is an error, not coerced);
fields the server does not know are ignored, as OpenAI clients send many. `null` for an
optional field means "the default", as the official SDKs may send it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from api.errors import APIError, invalid
from contract.jobspec import JobSpec, Message

_CONFIG = ConfigDict(strict=True, extra="ignore")

Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Field(ge=1)]
StopString = Annotated[str, Field(min_length=1)]


class TextPart(BaseModel):
    model_config = _CONFIG
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _CONFIG
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = _CONFIG
    include_usage: bool | None = None


class _Common(BaseModel):
    model_config = _CONFIG
    model: Annotated[str, Field(min_length=1)]
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.n not in (None, 1):
            raise ValueError("n: only n=1 is supported")
        if self.stream_options is not None and not (self.stream or self.background):
            raise ValueError("stream_options: only allowed when stream or background is true")
        return self

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _sampling(self) -> dict:
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return {
            "temperature": 1.0 if self.temperature is None else float(self.temperature),
            "top_p": 1.0 if self.top_p is None else float(self.top_p),
            "stop": tuple(stop),
            "seed": self.seed,
            "presence_penalty": float(self.presence_penalty or 0.0),
            "frequency_penalty": float(self.frequency_penalty or 0.0),
        }


class ChatRequest(_Common):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None

    def to_spec(self, completion_id: str) -> JobSpec:
        messages = tuple(
            Message(role="system" if m.role == "developer" else m.role, content=m.text())
            for m in self.messages
        )
        return JobSpec(
            id=completion_id,
            kind="chat",
            model=self.model,
            messages=messages,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            **self._sampling(),
        )


class CompletionRequest(_Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def to_spec(self, completion_id: str) -> JobSpec:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return JobSpec(
            id=completion_id,
            kind="text",
            model=self.model,
            prompt=prompt,
            max_tokens=16 if self.max_tokens is None else self.max_tokens,  # OpenAI's default
            **self._sampling(),
        )


@dataclass(frozen=True)
class Limits:
    """Per-request ceilings (MAX_MESSAGES, MAX_PROMPT_CHARS, MAX_TOKENS_LIMIT, MAX_STOP,
    MAX_STOP_CHARS). The prompt's length in tokens is checked by the worker, against the
    model's context (`context_length_exceeded`)."""

    max_messages: int = 512
    max_prompt_chars: int = 500_000
    max_tokens: int = 8192
    max_stop: int = 4
    max_stop_chars: int = 256


def enforce(req: ChatRequest | CompletionRequest, limits: Limits) -> None:
    """Raise an OpenAI-style 400 for the first limit the request exceeds."""
    if isinstance(req, ChatRequest):
        if len(req.messages) > limits.max_messages:
            raise invalid(
                f"Invalid 'messages': array too long. Expected an array with maximum length "
                f"{limits.max_messages}, but got an array with length {len(req.messages)} instead.",
                param="messages",
                code="array_above_max_length",
            )
        chars, param = sum(len(m.text()) for m in req.messages), "messages"
        wanted, wanted_param = (
            req.max_completion_tokens or req.max_tokens,
            ("max_completion_tokens" if req.max_completion_tokens else "max_tokens"),
        )
    else:
        prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        chars, param = len(prompt), "prompt"
        wanted, wanted_param = req.max_tokens, "max_tokens"
    if chars > limits.max_prompt_chars:
        raise invalid(
            f"Invalid '{param}': the prompt is {chars} characters long; the limit is "
            f"{limits.max_prompt_chars}.",
            param=param,
            code="string_above_max_length",
        )
    if wanted is not None and wanted > limits.max_tokens:
        raise invalid(
            f"{wanted_param} is too large: {wanted}. This server allows at most {limits.max_tokens} "
            "completion tokens.",
            param=wanted_param,
            code="invalid_value",
        )
    stop = req.stop if isinstance(req.stop, list) else [req.stop] if req.stop else []
    if len(stop) > limits.max_stop:
        raise invalid(
            f"Invalid 'stop': array too long. Expected an array with maximum length {limits.max_stop}, "
            f"but got an array with length {len(stop)} instead.",
            param="stop",
            code="array_above_max_length",
        )
    if any(len(s) > limits.max_stop_chars for s in stop):
        raise invalid(
            f"Invalid 'stop': each stop sequence may be at most {limits.max_stop_chars} characters.",
            param="stop",
            code="string_above_max_length",
        )


def parse(model: type[ChatRequest] | type[CompletionRequest], body: bytes):
    """Raw body -> request model, or an APIError saying precisely what is wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _explain(exc) from None


def _explain(exc: ValidationError) -> APIError:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if not _is_type_tag(str(p))]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and ":" in msg:
        param, _, msg = msg.partition(": ")
        return invalid(f"Invalid '{param}': {msg}.", param=param)
    param = ".".join(loc) or None
    if err["type"] == "missing":
        return invalid(
            f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    return invalid(f"Invalid '{param}': {msg}.", param=param, code="invalid_value")


def _is_type_tag(part: str) -> bool:
    """Pydantic names union members in error locations ('str', 'list[...]'): not params."""
    return (
        part in {"str", "int", "float", "bool", "none"}
        or "[" in part
        or part.startswith(("function-", "constrained-"))
    )
