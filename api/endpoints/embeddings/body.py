"""An embeddings request, OpenAI's shape.

`input` is a string, a list of strings, a token array or a list of token arrays.
`encoding_format` is float or base64. `dimensions` is for a Matryoshka-trained model
(MATRYOSHKA_MODELS). `user` is accepted.

Everything checked here is refused before anything is enqueued. An input's length in tokens
is the worker's to count, since a string's tokens are the model's. An input too long is a 400
naming it."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, field_validator

from api.endpoints.body import Body, PositiveInt
from api.http.errors import invalid
from api.http.parsing import too_many, unsupported
from api.jobs import reservation
from api.settings import Limits
from contract import keys
from contract.jobspec import JobSpec
from contract.tiers import embedding_pool

TokenId = Annotated[int, Field(ge=0)]
Input = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
)


SHAPES = "a string, an array of strings, an array of token ids or an array of token arrays"


def _token_ids(value: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def input_problem(value: object) -> str | None:
    """What is wrong with an `input`, in words that name the input at fault. None: nothing."""
    if isinstance(value, str):
        return "must not be an empty string" if not value else None
    if not isinstance(value, list):
        return f"must be {SHAPES}"
    if not value:
        return "must not be an empty array"
    if all(isinstance(x, str) for x in value):
        empty = next((i for i, x in enumerate(value) if not x), None)
        return None if empty is None else f"input[{empty}] is an empty string"
    if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return None if _token_ids(value) else "token ids must be non-negative integers"
    if all(isinstance(x, list) for x in value):
        bad = next((i for i, x in enumerate(value) if not x or not _token_ids(x)), None)
        return None if bad is None else f"input[{bad}] must be a non-empty array of non-negative token ids"
    return f"must be {SHAPES}, not a mix"


class EmbeddingRequest(Body):
    input: Input
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: PositiveInt | None = None
    # what a completion's body has and an embedding's has not
    stream: None = None  # type: ignore[assignment]
    background: None = None  # type: ignore[assignment]
    cache_salt: None = None  # type: ignore[assignment]
    metadata: None = None  # type: ignore[assignment]
    store: None = None  # type: ignore[assignment]

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value: object) -> object:
        if problem := input_problem(value):
            raise ValueError(problem)
        return value

    @property
    def pool(self) -> str:
        return embedding_pool(self.model)

    def inputs(self) -> list[str | list[int]]:
        """Every input, in order. A token array is one input, a list of them many."""
        x = self.input
        if isinstance(x, str) or (x and isinstance(x[0], int)):
            return [x]  # type: ignore[list-item]
        return list(x)  # type: ignore[arg-type]

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        inputs = tuple(x if isinstance(x, str) else tuple(x) for x in self.inputs())
        return JobSpec(
            id=job_id,
            kind="embed",
            model=self.pool,
            inputs=inputs,
            dimensions=self.dimensions or 0,
            max_tokens=0,
            priority=self.priority,
        )

    def job_fields(self, job_id: str) -> dict[str, str]:
        """The model as asked and the encoding, which the answer says. The job records its pool."""
        echo = {"model": self.model, "encoding_format": self.encoding_format or "float"}
        return {keys.JobField.ECHO: json.dumps(echo)}

    def prompt_chars(self) -> tuple[int, str]:
        return sum(len(x) for x in self.inputs() if isinstance(x, str)), "input"

    def context_chars(self) -> tuple[int, str]:
        """The longest input's: each is embedded in a context of its own."""
        inputs = self.inputs()
        chars = [len(x) if isinstance(x, str) else 0 for x in inputs]
        longest = max(range(len(chars)), key=chars.__getitem__)
        return chars[longest], "input" if isinstance(self.input, str) else f"input[{longest}]"

    def wanted_tokens(self) -> tuple[int | None, str]:
        return None, "max_tokens"

    def enforce(self, limits: Limits) -> None:
        super().enforce(limits)
        inputs = self.inputs()
        if len(inputs) > limits.max_embedding_inputs:
            raise too_many("input", limits.max_embedding_inputs, len(inputs))
        tokens = reservation.embedding_inputs(inputs)
        if tokens > limits.max_embedding_tokens:
            raise invalid(
                f"Invalid 'input': up to {tokens} tokens (a token array's ids, a string's UTF-8 "
                f"bytes and {reservation.EMBED_SPECIALS}); this server embeds at most "
                f"{limits.max_embedding_tokens} per request (MAX_EMBEDDING_TOKENS). Send fewer "
                "or shorter inputs per request.",
                param="input",
            )
        if self.dimensions is not None and self.model not in limits.matryoshka_models:
            raise unsupported(
                "dimensions",
                f"The model '{self.model}' has no shorter embeddings (it is not declared "
                "Matryoshka-trained: MATRYOSHKA_MODELS).",
            )
