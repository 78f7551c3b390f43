"""Why a job cannot be run, or go on. It is reported to the client as an OpenAI error."""

from __future__ import annotations

from contract import errors


class PromptRejected(ValueError):
    error = errors.INVALID_REQUEST

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLong(PromptRejected):
    error = errors.CONTEXT_LENGTH

    def __init__(self, prompt_tokens: int, n_ctx: int, param: str) -> None:
        super().__init__(
            f"This model's maximum context length is {n_ctx} tokens. However, your prompt is "
            f"{prompt_tokens} tokens long, which leaves no room for a completion.",
            param,
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class InputTooLong(PromptRejected):
    """An embedding input longer than the model reads at once (EMBEDDING_TRUNCATE off)."""

    error = errors.CONTEXT_LENGTH

    def __init__(self, tokens: int, n_ctx: int, param: str) -> None:
        super().__init__(
            f"Invalid '{param}': the input is {tokens} tokens long; this model embeds at most {n_ctx} "
            "tokens per input.",
            param,
        )


class GrammarDeadEnd(RuntimeError):
    """No token can continue the job's grammar (or a resumed job's text does not fit it)."""
