"""A key's per-minute budgets, and the headers that tell a client where it stands. OpenAI's
are `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, with resets as durations
(`6m0s`). On the Messages endpoint they are Anthropic's
`anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, with resets as RFC 3339
times. Budgets are counted per minute since the epoch, so each resets when its minute ends.
A budget of 0 is none, and has no headers."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Budgets:
    """What one key may use a minute (0: no limit)."""

    requests_per_minute: int = 0
    bytes_per_minute: int = 0
    tokens_per_minute: int = 0


def window_end_ms(minute: int) -> int:
    """When the budgets counted in `minute` reset (ms since the epoch)."""
    return (minute + 1) * 60_000


def retry_after_s(minute: int) -> int:
    """Whole seconds until `minute`'s budgets reset (at least 1)."""
    return max(1, math.ceil((window_end_ms(minute) - time.time() * 1000) / 1000))


def duration(ms: int) -> str:
    """A duration as OpenAI writes its resets (Go's): `6m0s`, `1.5s`, `120ms`."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    minutes, rest = divmod(ms, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def headers(
    budgets: Budgets, minute: int, requests: int | None, tokens: int | None, anthropic: bool = False
) -> dict[str, str]:
    """The headers for a key that has used `requests` and `tokens` of `minute`'s budgets.
    Either may be None: not known, and no headers for it."""
    end_ms = window_end_ms(minute)
    left_ms = end_ms - int(time.time() * 1000)
    out: dict[str, str] = {}
    for what, limit, used in (
        ("requests", budgets.requests_per_minute, requests),
        ("tokens", budgets.tokens_per_minute, tokens),
    ):
        if not limit or used is None:
            continue
        remaining = str(max(0, limit - used))
        if anthropic:
            reset = datetime.fromtimestamp(end_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out |= {
                f"anthropic-ratelimit-{what}-limit": str(limit),
                f"anthropic-ratelimit-{what}-remaining": remaining,
                f"anthropic-ratelimit-{what}-reset": reset,
            }
        else:
            out |= {
                f"x-ratelimit-limit-{what}": str(limit),
                f"x-ratelimit-remaining-{what}": remaining,
                f"x-ratelimit-reset-{what}": duration(left_ms),
            }
    return out
