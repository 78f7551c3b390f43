"""api/http/ratelimits.py: the headers OpenAI's and Anthropic's clients read."""

from __future__ import annotations

import time

from api.http.ratelimits import Budgets, duration, headers, retry_after_s


def test_durations_are_written_as_openai_writes_them():
    assert duration(360_000) == "6m0s"
    assert duration(90_500) == "1m30.5s"
    assert duration(1_500) == "1.5s"
    assert duration(59_000) == "59s"
    assert duration(120) == "120ms"
    assert duration(-5) == "0ms"


def test_openai_headers_say_what_is_left_of_this_minute_and_when_it_resets():
    minute = int(time.time() // 60)
    out = headers(Budgets(requests_per_minute=60, tokens_per_minute=1000), minute, 3, 1200)
    assert out["x-ratelimit-limit-requests"] == "60" and out["x-ratelimit-remaining-requests"] == "57"
    assert out["x-ratelimit-limit-tokens"] == "1000" and out["x-ratelimit-remaining-tokens"] == "0"
    assert out["x-ratelimit-reset-tokens"].endswith(("s", "ms"))
    assert not any(h.startswith("anthropic") for h in out)


def test_a_budget_of_zero_has_no_headers_and_anthropic_s_resets_are_times():
    minute = int(time.time() // 60)
    out = headers(Budgets(tokens_per_minute=500), minute, 0, 100, anthropic=True)
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((minute + 1) * 60))
    assert out == {
        "anthropic-ratelimit-tokens-limit": "500",
        "anthropic-ratelimit-tokens-remaining": "400",
        "anthropic-ratelimit-tokens-reset": end,
    }
    assert 1 <= retry_after_s(minute) <= 60
