"""A job that keeps a worker's slot for as long as a test needs it, whatever the machine.

A test that needs a busy worker (so that the next request waits in the queue, or a stream
is still running when something happens to it) must not count on a fixed number of tokens
taking a fixed time: a faster machine finishes them first (issue 44). A holding job has the
model's end tokens banned with `logit_bias` and more tokens than any test waits for, so it
runs until the test cancels it, which `holding` does on the way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

END_TOKENS = (0, 2, 4)
"""The default model's end-of-generation tokens (llama_vocab_is_eog over SmolLM2's vocabulary:
<|endoftext|>, <|im_end|> and <repo_name>); tests/unit/test_hold.py checks the list."""

NO_END = {str(t): -100 for t in END_TOKENS}
"""`logit_bias` that bans every end token: the job generates until it is cancelled, or its
max_tokens or its context runs out."""

HOLD_TOKENS = 8192
"""MAX_TOKENS_LIMIT: the job runs until its slot's context is full (N_CTX, 4096 tokens), if it
is not cancelled first: two minutes on these 2-core machines, seconds on a fast GPU."""
PROMPT = [{"role": "user", "content": "Count from one to ten thousand, one number a line."}]


def holding_body(model: str, **extra: object) -> dict:
    """A chat body that generates until cancelled (or its context is full)."""
    return {
        "model": model,
        "messages": PROMPT,
        "max_tokens": HOLD_TOKENS,
        "logit_bias": NO_END,
        **extra,
    }


@contextlib.contextmanager
def holding(base: str, model: str, headers: dict[str, str] | None = None, **extra: object) -> Iterator[str]:
    """A background job holding a slot; yields its id, and cancels it on the way out."""
    with httpx.Client(base_url=base, headers=headers or {}, timeout=60) as client:
        answer = client.post("/v1/chat/completions", json=holding_body(model, background=True, **extra))
        answer.raise_for_status()
        job_id = answer.json()["id"]
        try:
            yield job_id
        finally:
            with contextlib.suppress(httpx.HTTPError):
                client.post(f"/v1/chat/completions/{job_id}/cancel")
