"""Why a job's prompt cannot be run: reported to the client as an OpenAI error."""

from __future__ import annotations


class PromptRejected(ValueError):
    code = "invalid_request"

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLong(PromptRejected):
    code = "context_length_exceeded"

    def __init__(self, prompt_tokens: int, n_ctx: int, param: str) -> None:
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens. However, your prompt is "
            f"{prompt_tokens} tokens long, which leaves no room for a completion.",
            param,
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
