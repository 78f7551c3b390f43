"""worker/engine/grammar.py with the real model's vocabulary, in-process: a Hermes call after free
text is held to the offered tools from its `<tool_call>` on, and text that cannot fit the
grammar at the trigger leaves the job unconstrained instead of aborting the process."""

from __future__ import annotations

import pytest

from contract.jobspec import JobSpec, Message, Tool
from contract.schema import schema_grammar
from tests.integration.test_batching import make_engine
from worker.engine.grammar import GrammarGate, TriggeredGate
from worker.tools.hermes import HermesTools

pytestmark = pytest.mark.integration

WEATHER = Tool(
    "get_weather",
    "Get the weather.",
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def engine():
    e = make_engine(1)
    yield e
    e.close()


def gate(engine) -> TriggeredGate:
    spec = JobSpec(
        id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "hi"),), tools=(WEATHER,)
    )
    tools = HermesTools()
    grammar, trigger = tools.grammar(spec), tools.trigger(spec)
    assert grammar and trigger == "<tool_call>"  # tool_choice auto, no response format
    make = lambda: GrammarGate(engine._model.vocab, grammar, engine.prompts.controls)  # noqa: E731
    return TriggeredGate(make, trigger.encode(), engine.piece)


def tokens(engine, text: str) -> list[int]:
    return engine._model.tokenize(text.encode(), add_bos=False, special=False)


def feed(g: TriggeredGate, ids: list[int]) -> None:
    for t in ids:
        assert g.allows(t)
        g.accept(t)


def test_free_text_then_the_call_is_held_to_the_offered_tools(engine):
    g = gate(engine)
    eos = engine._model.token_eos()
    feed(g, tokens(engine, "Let me look that up for you.\n"))
    assert g.allows(eos)  # free text may end at any point
    feed(g, tokens(engine, '<tool_call>\n{"name": "'))
    assert not any(g.allows(t) for t in tokens(engine, "launch")[:1])  # a tool nobody offered
    assert g.allows(tokens(engine, "get")[0])
    assert not g.allows(eos)  # nor may it stop mid-call
    feed(g, tokens(engine, 'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'))
    assert g.allows(eos)
    assert not g.allows(tokens(engine, " More")[0])  # nothing after the call
    g.close()


def test_a_trigger_the_grammar_cannot_follow_leaves_the_text_free(engine):
    g = gate(engine)
    ids = tokens(engine, "a<<tool_call>")
    assert [engine.piece(t) for t in ids][1] == b"<<"  # the tag's first byte is not its token's
    feed(g, ids)  # the grammar cannot take that token's "<": given up, not an abort
    feed(g, tokens(engine, " is a tag, and then more text."))  # free: no call grammar holds it
    assert g.allows(engine._model.token_eos())
    g.close()


def _accepts(engine, gbnf: str, text: str) -> bool:
    """Whether llama.cpp's grammar takes `text` whole and then lets the model stop."""
    g = GrammarGate(engine._model.vocab, gbnf, engine.prompts.controls)
    try:
        for t in tokens(engine, text):
            if not g.allows(t):
                return False
            g.accept(t)
        return g.allows(engine._model.token_eos())
    finally:
        g.close()


def test_optional_properties_are_any_ordered_subset_in_llama_cpp(engine):
    """The linear chain of optional properties (contract/schema.py) means what the quadratic
    one did: any of them, each at most once, in declaration order."""
    props = {name: {"type": "integer"} for name in ("a", "b", "c")}
    gbnf = schema_grammar({"type": "object", "properties": props})
    for text in ("{}", '{"b": 1}', '{"a": 1, "c": 2}', '{"a": 1, "b": 2, "c": 3}', '{"c": 3}'):
        assert _accepts(engine, gbnf, text), text
    for text in ('{"c": 3, "a": 1}', '{"a": 1, "a": 2}', '{"b": 1,}', '{"d": 1}'):
        assert not _accepts(engine, gbnf, text), text
    many = schema_grammar(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1500)}}
    )
    assert _accepts(engine, many, '{"p1499": 7}') and _accepts(engine, many, '{"p3": 1, "p1200": 2}')
