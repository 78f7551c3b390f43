"""worker/tools/call_rules.py: a custom tool's call, forced, in each protocol's grammar: the JSON
envelope, Hermes and harmony take the call with a patch of Codex's grammar as its `input`
string, and refuse one that is not (held against llama.cpp's grammar engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.freeform.calls import INPUT_SCHEMA
from contract.jobspec import NAMED, JobSpec, Message, Tool
from worker.settings import default_model_path
from worker.text import harmony
from worker.tools.harmony import HarmonyTools
from worker.tools.hermes import HermesTools
from worker.tools.json_envelope import JsonTools

llama_cpp = pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")

GRAMMAR = (Path(__file__).parents[2] / "contract" / "freeform" / "apply_patch.lark").read_text()
PATCHER = Tool(
    "apply_patch", "Edit files.", INPUT_SCHEMA, {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}
)
SPEC = JobSpec(
    id="resp_x",
    kind="chat",
    model="m",
    messages=(Message("user", "Patch it."),),
    tools=(Tool("get_weather"), PATCHER),
    tool_choice=NAMED + "apply_patch",
    parallel_tool_calls=False,
)
PATCH = '*** Begin Patch\n*** Add File: a "b".txt\n+\tHello\n*** End Patch\n'
NOT_A_PATCH = "*** Begin Patch\nHello\n*** End Patch\n"
HARMONY_CALL = (
    f"{harmony.CHANNEL}commentary to=functions.apply_patch {harmony.CONSTRAIN}json{harmony.MESSAGE}"
)


def _arguments(text: str) -> str:
    return json.dumps({"input": text}, ensure_ascii=False)


@pytest.mark.parametrize(
    ("protocol", "envelope"),
    [
        (JsonTools(), lambda args: f'{{"tool_call": {{"name": "apply_patch", "arguments": {args}}}}}'),
        (
            HermesTools(),
            lambda args: f'<tool_call>\n{{"name": "apply_patch", "arguments": {args}}}\n</tool_call>',
        ),
        (HarmonyTools(), lambda args: HARMONY_CALL + args),
    ],
    ids=["json", "hermes", "harmony"],
)
def test_each_protocol_holds_a_custom_call_s_input_to_its_grammar(accepts, protocol, envelope):
    gbnf = protocol.grammar(SPEC)
    assert accepts(gbnf, envelope(_arguments(PATCH)))
    assert not accepts(gbnf, envelope(_arguments(NOT_A_PATCH)))
    assert not accepts(gbnf, envelope('{"input": "' + PATCH + '"}'))  # raw newlines in a JSON string
    assert not accepts(gbnf, envelope('{"city": "Paris"}'))  # another tool's arguments
