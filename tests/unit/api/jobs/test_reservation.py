"""api.jobs.reservation: the bound of a prompt's tokens counts every client string the template
renders, each at the most it can cost (tests/unit/worker/engine/test_prompt_overhead.py checks
the bound against the real tokenizer and templates)."""

from __future__ import annotations

from api.jobs.reservation import as_json, embedding_inputs, plain, prompt_tokens
from contract.jobspec import JobSpec, Message, Tool, ToolCall
from contract.prefixes import PromptOverhead

OVERHEAD = PromptOverhead(fixed=100, per_part=10)


def chat(*messages: Message, **fields) -> JobSpec:
    return JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=messages, **fields)


def test_plain_text_is_a_token_a_byte_and_a_leading_space():
    assert plain("") == 0 and plain("fox") == 4
    assert plain("\U000e0041" * 10) == 41 and plain("狐") == 4


def test_json_text_counts_what_its_escapes_could_be():
    assert as_json("a") == 3  # the quotes
    assert as_json("<") == 2 + 6 and as_json("é") == 2 + 6 and as_json("\U000e0041") == 2 + 12
    assert as_json('"') == 2 + 2 and as_json("\n") == 2 + 6
    assert as_json({"a": 1}) > len('{"a": 1}')  # indented: each member on its own line


def test_every_string_the_template_renders_is_counted():
    base = prompt_tokens(chat(Message("user", "hi")), OVERHEAD)
    assert base == 100 + 10 + plain("hi")
    reasoning = chat(
        Message("user", "hi"), Message("assistant", "ok", reasoning="thought"), Message("user", "hi")
    )
    assert prompt_tokens(reasoning, OVERHEAD) == 100 + 30 + 3 * 3 + plain("thought")
    call = ToolCall("call_1", "lookup", '{"q": "fox"}')
    tools = chat(
        Message("user", "hi"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "found", tool_call_id="call_1"),
        tools=(Tool("lookup", "Looks up."),),
    )
    parts = 100 + 10 * (3 + 1 + 1)  # three messages, a call, a tool
    assert prompt_tokens(tools, OVERHEAD) > parts + plain("hi") + as_json("found") + as_json('{"q": "fox"}')
    kwargs = chat(Message("user", "hi"), template_kwargs={"enable_thinking": False})
    assert prompt_tokens(kwargs, OVERHEAD) == base + 10 + as_json({"enable_thinking": False})


def test_a_raw_prompt_and_embedding_inputs():
    assert prompt_tokens(JobSpec(id="cmpl-x", kind="text", model="m", prompt="abc"), OVERHEAD) == 5
    assert embedding_inputs([[1, 2, 3], "ab"]) == 3 + 2 + 4
    embed = JobSpec(id="embd-x", kind="embed", model="m", inputs=((1, 2), "é"))
    assert prompt_tokens(embed, OVERHEAD) == 2 + 2 + 4
