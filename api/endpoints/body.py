"""What every body that creates a job shares, whichever endpoint it comes by.

`Body` is the base: the model, streaming, background and the queue tier. It also checks the
limits every request must keep. Chat and Responses both take the parameter shapes here:
functions, schemas, sampling ranges.

A few fields change nothing here by their nature, and are accepted: `user`, `metadata`,
`store` (README).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr

from api.http.errors import APIError, invalid
from api.http.parsing import Strict, too_many
from api.settings import Limits
from contract import tiers
from contract.errors import MODEL_NOT_FOUND, STRING_TOO_LONG
from contract.jobspec import JobSpec, Message, template_kwargs_problem

# OpenAI's limit
MAX_TOOLS = 128
# OpenAI's reasoning efforts
Effort = Literal["none", "minimal", "low", "medium", "high"]


def template_kwargs(effort: str | None, kwargs: dict | None, param: str) -> dict:
    """A chat template's extra arguments: the client's own and the reasoning effort asked. The
    client's own come as `chat_template_kwargs`, as vLLM and llama-server take them. The reasoning
    effort asked reaches the template as `reasoning_effort`. An effort of "none" also sets
    `enable_thinking` false (Qwen3's and GLM's switch), unless the client set it. A template that
    reads neither ignores them."""
    out = dict(kwargs or {})
    if effort is not None:
        out.setdefault("reasoning_effort", effort)
        if effort == "none":
            out.setdefault("enable_thinking", False)
    if problem := template_kwargs_problem(out):
        raise invalid(f"Invalid '{param}': {problem}.", param=param)
    return out


class Function(Strict):
    """What names a function in a request: `{"type": "function", ...}`."""

    type: Literal["function"]


class SchemaFormat(Strict):
    """What a json_schema output format says besides its name (chat and Responses)."""

    description: str | None = None
    schema_: Annotated[dict | None, Field(alias="schema")] = None
    # the schema is always enforced
    strict: bool | None = None


SchemaName = Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


Temperature = Annotated[float, Field(ge=0.0, le=2.0)]


TopP = Annotated[float, Field(ge=0.0, le=1.0)]


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


PositiveInt = Annotated[int, Field(ge=1)]


StopString = Annotated[str, Field(min_length=1)]


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None
    # the schema is always enforced
    strict: bool | None = None


class Body(Strict):
    """What every body that creates a job has. Each endpoint's body says how it becomes a job
    (`to_spec`) and what else its job records (`job_fields`). It also says what of it the request
    limits measure."""

    model: Annotated[str, Field(min_length=1)]
    stream: bool | None = None
    background: bool | None = None
    # The queue tier (contract.keys.PRIORITIES): workers take `priority` jobs first, `flex` last.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    # Prompt caches are the key's own; keys that send the same salt share one (vLLM's
    # extension; contract/prefixes.py `cache_scope`). It should be a long random secret.
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # the request's images as `to_spec` read them (api/endpoints/images.py), and each one's part
    _images: list = PrivateAttr(default_factory=list)
    _image_params: list[str] = PrivateAttr(default_factory=list)
    # the bytes of its remote image URLs, fetched before `to_spec` (api/endpoints/image_urls.py)
    _fetched: dict[str, bytes] = PrivateAttr(default_factory=dict)
    # Accepted, and change nothing here (see the module docstring).
    user: str | None = None
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    store: bool | None = None
    # OpenAI's `user`, renamed
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    def image_urls(self) -> list[tuple[str, str]]:
        """Each image URL of the request, with its part (none, here). The remote ones are fetched
        before `to_spec`."""
        return []

    @property
    def pool(self) -> str:
        """The pool whose queues the job waits in. It is the model's pool (for embeddings, its
        embedding pool). A name that is another kind's pool (`<model>#embed`) names no model here:
        404."""
        if tiers.served_model(self.model)[1] != "chat":
            raise APIError(MODEL_NOT_FOUND, f"The model '{self.model}' does not exist.", param="model")
        return self.model

    @property
    def include_usage(self) -> bool:
        return False

    @property
    def priority(self) -> str:
        return "default" if self.service_tier in (None, "auto") else self.service_tier

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        """The job, with every default applied. A completion is never unbounded. Without a
        max_tokens it stops at MAX_TOKENS_LIMIT, or when the context is full."""
        raise NotImplementedError

    def job_fields(self, job_id: str) -> dict[str, str]:
        """What the job's hash records beside the spec, for the endpoint to show later."""
        return {}

    def prompt_chars(self) -> tuple[int, str]:
        """(characters of prompt, the parameter that holds them)."""
        raise NotImplementedError

    def context_chars(self) -> tuple[int, str]:
        """(characters one context must hold, the parameter that holds them). They are the prompt's,
        checked against the model's context before the job is made."""
        return self.prompt_chars()

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


def first_unanswered(messages: Iterable[Message]) -> int | None:
    """The index of the first tool result that answers no call made before it. This is OpenAI's
    rule, for chat's messages and a response's items alike. None when every result answers a
    call."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        calls.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in calls:
            return i
    return None
