"""`POST /v1/completions`: the legacy completions' body, a prompt in place of messages. It
shares its base with chat (api/endpoints/chat/body.py `CompletionBody`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from api.endpoints.chat.body import CompletionBody
from api.settings import Limits
from contract.jobspec import JobSpec


class CompletionRequest(CompletionBody):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    # the legacy shape: how many alternatives
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        return JobSpec(
            id=job_id,
            kind="text",
            model=self.model,
            prompt=self.text(),
            # OpenAI's default
            max_tokens=16 if self.max_tokens is None else self.max_tokens,
            **self._sampling(),
            logprobs=self.logprobs is not None,
            top_logprobs=self.logprobs or 0,
            priority=self.priority,
        )

    def prompt_chars(self) -> tuple[int, str]:
        return len(self.text()), "prompt"
