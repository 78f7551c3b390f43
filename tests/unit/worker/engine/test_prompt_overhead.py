"""worker.engine.prompts' overhead, with api.jobs.reservation: the tokens a job reserves bound what its
prompt really is, on the real tokenizer and templates, for text chosen to cost the most tokens
a character (tag characters, emoji, CJK, JSON escapes) and every place a client's string
reaches the template."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.jobs import reservation
from contract.jobspec import JobSpec, Message, Tool, ToolCall
from contract.prefixes import PromptOverhead
from worker.settings import default_model_path

llama_cpp = pytest.importorskip("llama_cpp")
from llama_cpp._internals import LlamaModel  # noqa: E402

from worker.engine.prompts import ChatPrompts  # noqa: E402

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")

DATA = Path(__file__).parents[3] / "data"
TEMPLATES = [None, "hermes-chatml.jinja", "thinking-chatml.jinja", "gpt-oss.jinja"]
COSTLY = [
    "\U000e0041" * 200,
    "🦊🔥" * 80,
    "狐狸" * 100,
    "<>&'\"\\" * 50,
    "\x01\x02" * 40,
    "plain words " * 30,
]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    return LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)


def measured(model: LlamaModel, template: str | None) -> tuple[ChatPrompts, PromptOverhead]:
    prompts = ChatPrompts(model, (DATA / template).read_text() if template else None)
    return prompts, prompts.overhead("m")


def conversations(text: str) -> list[JobSpec]:
    call = ToolCall(id=f"call_{len(text)}", name="lookup", arguments='{"q": ' + repr(text)[:60] + "}")
    tool = Tool(
        "lookup",
        description=text,
        parameters={"type": "object", "properties": {"q": {"type": "string", "description": text}}},
    )
    messages = [
        (Message("user", text),),
        (Message("system", text), Message("user", text)),
        (
            Message("user", text),
            Message("assistant", text, reasoning=text),
            Message("user", text),
        ),
        (
            Message("user", text),
            Message("assistant", "", tool_calls=(call, call)),
            Message("tool", text, tool_call_id=call.id),
        ),
    ]
    return [
        JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=m, tools=tools)
        for m in messages
        for tools in ((), (tool, tool))
    ]


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_reservation_is_never_less_than_the_prompt(model, template):
    prompts, said = measured(model, template)
    assert said.fixed > 0 and said.per_part > 0
    for text in COSTLY:
        for spec in conversations(text):
            try:
                ids = prompts.prompt_ids(spec, 1 << 20)
            except Exception:  # the template refuses this conversation: nothing is reserved for it
                continue
            assert len(ids) <= reservation.prompt_tokens(spec, said), (template, text[:12], spec.messages)


def test_tag_characters_cost_four_tokens_each_and_are_reserved_as_such(model):
    """The review's attack: U+E0041 is 4 bytes of UTF-8 and 4 tokens here; the old estimate was
    a token per 4 characters, a sixteenth of it."""
    prompts, said = measured(model, None)
    spec = JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "\U000e0041" * 400),))
    used = len(prompts.prompt_ids(spec, 1 << 20))
    assert (
        used > 1600 and used <= reservation.prompt_tokens(spec, said) <= used + said.fixed + said.per_part + 1
    )


def test_a_template_without_a_tool_protocol_still_has_an_overhead(model):
    prompts, said = measured(model, None)  # SmolLM2's own: its default system prompt, JSON tools
    base = JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "a"),))
    assert len(prompts.prompt_ids(base, 4096)) - 1 <= said.fixed


# A template that renders no system message after the first turn: the worker folds one into a
# user turn, marked (worker/tools/late_system.py), and the marks are the template's text too.
FOLDING = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("template", [None, FOLDING], ids=["renders it", "folds it"])
def test_the_reservation_bounds_late_system_messages(model, template):
    prompts = ChatPrompts(model, template)
    said = prompts.overhead("m")
    for text in [*COSTLY, "a", ""]:
        late = tuple(Message("system", text) for _ in range(8))
        for messages in (
            (Message("user", text), *late),
            (Message("user", "x"), *late, Message("user", text)),
        ):
            spec = JobSpec(id="msg_x", kind="chat", model="m", messages=messages)
            assert len(prompts.prompt_ids(spec, 1 << 20)) <= reservation.prompt_tokens(spec, said), text[:12]
