"""The synthetic engine: deterministic words, resumable from any context, never a real model."""

from __future__ import annotations

import json

import pytest

from contract.jobspec import JobSpec
from worker.engine.protocol import Generation
from worker.engine.synthetic import EOS, SCRIPTED_COMMAND, SyntheticEngine
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
    return [(pick.token, piece) for pick, piece in engine.tokens(Generation(s, prompt, list(prior)))]


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


BASH = {
    "name": "Bash",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "description": {"type": "string"},
            "timeout": {"type": "number"},
        },
        "required": ["command", "description"],
    },
}
SHELL = {
    "name": "shell",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
    },
}


def _call(e: SyntheticEngine, s: JobSpec, prior=()) -> tuple[str, list]:
    """What the scripted job writes (after `prior`), and the calls its reply reads of all of it."""
    out = run(e, s, e.prompt_ids(s), prior)
    text = "".join(p.decode() for _, p in out)
    reply = e.reply(s, e.prompt_ids(s))
    whole = "".join(e.piece(t).decode() for t in prior) + text
    parts = reply.feed(whole)
    parts.add(reply.end())
    return text, parts.calls


def test_a_job_offered_a_shell_tool_calls_it_once_then_answers():
    """A coding agent's round trip: the call (its command a string, or an argv as Codex's
    `shell` takes it), and after the tool's result the words."""
    e = SyntheticEngine("synthetic-t", 4096, 3, rate=0, tool_calls=True)
    s = spec(tools=[BASH])
    text, calls = _call(e, s)
    assert text.startswith("<tool_call>") and calls[0].name == "Bash"
    args = json.loads("".join(c.arguments for c in calls))
    assert args == {"command": SCRIPTED_COMMAND, "description": "Writes a file"}  # required ones only
    codex = _call(e, spec(tools=[SHELL]))[1]
    assert json.loads("".join(c.arguments for c in codex)) == {"command": ["bash", "-lc", SCRIPTED_COMMAND]}
    called = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "name": "Bash", "arguments": json.dumps(args)}],
    }
    result = {"role": "tool", "content": "", "tool_call_id": "call_1"}
    answered = spec(tools=[BASH], messages=[{"role": "user", "content": "a"}, called, result])
    assert [p for _, p in run(e, answered, e.prompt_ids(answered))] == [b" w0", b" w1", b" w2", b""]
    again = spec(tools=[BASH], messages=[*answered.to_dict()["messages"], {"role": "user", "content": "b"}])
    assert _call(e, again)[1]  # a new user turn: a call again


def test_a_resumed_scripted_call_goes_on_from_its_character():
    e = SyntheticEngine("synthetic-t", 4096, 3, rate=0, tool_calls=True)
    s = spec(tools=[BASH])
    whole = run(e, s, e.prompt_ids(s))
    text, calls = _call(e, s, prior=[t for t, _ in whole[:7]])
    assert text == "".join(p.decode() for _, p in whole[7:])
    assert calls[0].name == "Bash"


def test_without_the_setting_or_a_shell_tool_the_words_as_ever():
    words = [b" w0", b" w1", b" w2", b""]
    off = SyntheticEngine("synthetic-t", 4096, 3, rate=0)
    on = SyntheticEngine("synthetic-t", 4096, 3, rate=0, tool_calls=True)
    for e, s in ((off, spec(tools=[BASH])), (on, spec(tools=[{**BASH, "name": "read_file"}])), (on, spec())):
        assert [p for _, p in run(e, s, e.prompt_ids(s))] == words
