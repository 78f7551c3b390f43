"""The synthetic engine: deterministic words, resumable from any context, never a real model."""

from __future__ import annotations

import pytest

from contract.jobspec import JobSpec
from worker.engine.synthetic import EOS, SyntheticEngine
from worker.errors import PromptTooLong


def spec(**kw) -> JobSpec:
    base = {
        "id": "chatcmpl-x",
        "kind": "chat",
        "model": "synthetic-t",
        "messages": [{"role": "user", "content": "a b c"}],
    }
    return JobSpec.from_dict({**base, **kw})


def run(engine: SyntheticEngine, s: JobSpec, prompt: list[int], prior=()) -> list[tuple[int, bytes]]:
    """(token id, piece) of each generated token."""
    return [(pick.token, piece) for pick, piece in engine.tokens(s, prompt, list(prior))]


def test_words_then_eos():
    e = SyntheticEngine("synthetic-t", 4096, 3, rate=0)
    s = spec()
    out = run(e, s, e.prompt_ids(s))
    assert [p for _, p in out] == [b" w0", b" w1", b" w2", b""]
    assert e.is_end(out[-1][0]) and out[-1][0] == EOS
    assert not any(e.is_end(t) for t, _ in out[:-1])


def test_resume_continues_after_the_published_tokens():
    e = SyntheticEngine("synthetic-t", 4096, 5, rate=0)
    s = spec()
    prompt = e.prompt_ids(s)
    first = run(e, s, prompt)
    resumed = run(e, s, prompt, [t for t, _ in first[:2]])
    assert resumed == first[2:]


def test_context_window_ends_without_eos():
    e = SyntheticEngine("synthetic-t", 10, 100, rate=0)
    s = spec()
    prompt = e.prompt_ids(s)  # 4 markers + 3 words
    out = run(e, s, prompt)
    assert len(out) == 10 - len(prompt) and not e.is_end(out[-1][0])


def test_prompt_too_long():
    e = SyntheticEngine("synthetic-t", 8, 3, rate=0)
    with pytest.raises(PromptTooLong):
        e.prompt_ids(spec(messages=[{"role": "user", "content": "one two three four five"}]))


def test_pacing_follows_the_rate():
    import time

    e = SyntheticEngine("synthetic-t", 4096, 6, rate=100)
    s = spec()
    t0 = time.monotonic()
    run(e, s, e.prompt_ids(s))
    assert time.monotonic() - t0 >= 0.05  # five gaps of 10 ms at least: a lower bound only


def test_refuses_a_real_model_name():
    with pytest.raises(SystemExit, match="synthetic"):
        SyntheticEngine("SmolLM2-135M-Instruct", 4096, 3, rate=0)
