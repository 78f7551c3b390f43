"""The legacy completions' objects (`text_completion`). They are chat's chunks
(api/endpoints/chat/objects.py) with a choice of plain text. Their logprobs are in the legacy shape."""

from __future__ import annotations

from api.endpoints.chat.objects import Chunks, Output, token_text
from contract.entries import Delta, TokenLogprob


class TextChunks(Chunks):
    object = "text_completion"
    chunk_object = "text_completion"

    def _choice(self, text: str | None, finish_reason: str | None) -> dict:
        return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish_reason}

    def _delta_choice(self, entry: Delta) -> dict:
        choice = self._choice(entry.text, None)
        if entry.logprobs:
            choice["logprobs"] = _text_logprobs(entry.logprobs)
        return choice

    def _message(self, text: str, finish_reason: str, out: Output) -> dict:
        choice = self._choice(text, finish_reason)
        if out.logprobs is not None:
            choice["logprobs"] = _text_logprobs(out.logprobs)
        return choice


def _text_logprobs(logprobs: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> dict:
    """The legacy completions' shape. `text_offset` counts from the start of these tokens."""
    offsets, at = [], 0
    for lp in logprobs:
        offsets.append(at)
        at += len(token_text(lp.piece))
    return {
        "tokens": [token_text(lp.piece) for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{token_text(b): v for b, v in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }
