"""Request bodies of the endpoints that create jobs, validated into a `JobSpec`.

Pydantic models in strict mode (a string where a number belongs is an error, not coerced);
fields the server does not know are ignored, as OpenAI clients send many. `null` for an
optional field means "the default", as the official SDKs may send it.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from api.errors import APIError, invalid
from api.settings import Limits
from contract.errors import ARRAY_TOO_LONG, BAD_REQUEST, MISSING_PARAMETER, STRING_TOO_LONG
from contract.jobspec import JobSpec, Message

_CONFIG = ConfigDict(strict=True, extra="ignore")
B = TypeVar("B", bound="Body")

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


class Body(BaseModel):
    """What every body that creates a job has; each surface's body says how it becomes a job
    (`to_spec`) and what of it the request limits measure."""

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

    def to_spec(self, completion_id: str, limits: Limits) -> JobSpec:
        """The job, with every default applied (a completion is never unbounded: without a
        max_tokens it stops at MAX_TOKENS_LIMIT, or when the context is full)."""
        raise NotImplementedError

    def prompt_chars(self) -> tuple[int, str]:
        """(characters of prompt, the parameter that holds them)."""
        raise NotImplementedError

    def wanted_tokens(self) -> tuple[int | None, str]:
        """(completion tokens asked for, the parameter that asks)."""
        return self.max_tokens, "max_tokens"

    def stops(self) -> list[str]:
        return self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []

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
            raise _too_many("stop", limits.max_stop, len(stop))
        if any(len(s) > limits.max_stop_chars for s in stop):
            raise invalid(
                f"Invalid 'stop': each stop sequence may be at most {limits.max_stop_chars} characters.",
                param="stop",
                error=STRING_TOO_LONG,
            )

    def _sampling(self) -> dict:
        return {
            "temperature": 1.0 if self.temperature is None else float(self.temperature),
            "top_p": 1.0 if self.top_p is None else float(self.top_p),
            "stop": tuple(self.stops()),
            "seed": self.seed,
            "presence_penalty": float(self.presence_penalty or 0.0),
            "frequency_penalty": float(self.frequency_penalty or 0.0),
        }


def _too_many(param: str, limit: int, got: int) -> APIError:
    return invalid(
        f"Invalid '{param}': array too long. Expected an array with maximum length {limit}, "
        f"but got an array with length {got} instead.",
        param=param,
        error=ARRAY_TOO_LONG,
    )


class ChatRequest(Body):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None

    def to_spec(self, completion_id: str, limits: Limits) -> JobSpec:
        messages = tuple(
            Message(role="system" if m.role == "developer" else m.role, content=m.text())
            for m in self.messages
        )
        return JobSpec(
            id=completion_id,
            kind="chat",
            model=self.model,
            messages=messages,
            max_tokens=self.max_completion_tokens or self.max_tokens or limits.max_tokens,
            **self._sampling(),
        )

    def prompt_chars(self) -> tuple[int, str]:
        return sum(len(m.text()) for m in self.messages), "messages"

    def wanted_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def enforce(self, limits: Limits) -> None:
        if len(self.messages) > limits.max_messages:
            raise _too_many("messages", limits.max_messages, len(self.messages))
        super().enforce(limits)


class CompletionRequest(Body):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

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
        )

    def prompt_chars(self) -> tuple[int, str]:
        return len(self.text()), "prompt"


def parse(body_type: type[B], body: bytes) -> B:
    """Raw body -> request model, or an APIError saying precisely what is wrong."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" and ":" in msg:
        param, _, msg = msg.partition(": ")
        return invalid(f"Invalid '{param}': {msg}.", param=param, error=BAD_REQUEST)
    param = ".".join(loc) or None
    if err["type"] == "missing":
        return invalid(f"Missing required parameter: '{param}'.", param=param, error=MISSING_PARAMETER)
    return invalid(f"Invalid '{param}': {msg}.", param=param)


def _is_type_tag(part: str) -> bool:
    """Pydantic names union members in error locations ('str', 'list[...]'): not params."""
    return (
        part in {"str", "int", "float", "bool", "none"}
        or "[" in part
        or part.startswith(("function-", "constrained-"))
    )
