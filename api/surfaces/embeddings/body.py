"""An embeddings request, OpenAI's shape: `input` is a string, a list of strings, a token
array or a list of token arrays; `encoding_format` float or base64; `dimensions` for a
Matryoshka-trained model (MATRYOSHKA_MODELS); `user` is accepted. Everything checked here
is refused before anything is enqueued; an input's length in tokens is the worker's to
count (a string's tokens are the model's), and an input too long is a 400 naming it."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field

from api.http.errors import invalid
from api.http.parsing import too_many, unsupported
from api.settings import Limits
from api.surfaces.body import Body, PositiveInt
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

    @property
    def pool(self) -> str:
        return embedding_pool(self.model)

    def inputs(self) -> list[str | list[int]]:
        """Every input, in order: a token array is one input, a list of them many."""
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
        """The model as asked and the encoding: the answer says them (the job records its pool)."""
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
        ids = sum(len(x) for x in inputs if not isinstance(x, str))
        if ids > limits.max_embedding_tokens:
            raise invalid(
                f"Invalid 'input': {ids} token ids; this server embeds at most "
                f"{limits.max_embedding_tokens} per request.",
                param="input",
            )
        if self.dimensions is not None and self.model not in limits.matryoshka_models:
            raise unsupported(
                "dimensions",
                f"The model '{self.model}' has no shorter embeddings (it is not declared "
                "Matryoshka-trained: MATRYOSHKA_MODELS).",
            )
