"""worker/tools/protocols.py: which tool protocol a chat template gets: harmony for gpt-oss's
channels, Hermes only for a template that renders a tool it is given and speaks `<tool_call>`,
the JSON envelope for any other (a template that cannot take tools included)."""

from __future__ import annotations

import pytest

from worker.text import harmony
from worker.tools.harmony import HarmonyTools
from worker.tools.hermes import HermesTools
from worker.tools.json_envelope import JsonTools
from worker.tools.protocols import PROBE_TOOL, detect

MESSAGES = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
# Qwen 2.5's way: the tools as JSON in the system turn, and how to call them
HERMES = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    'Return <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}' + MESSAGES
)


def jinja(template: str):
    """The template's render, with llama.cpp's `raise_exception` (as Jinja2ChatFormatter gives it)."""
    jinja2 = pytest.importorskip("jinja2")  # the worker's (llama-cpp-python's): tests/unit runs without it

    def raise_exception(message: str):
        raise jinja2.TemplateError(message)

    env = jinja2.Environment()
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render


def never(**kw) -> str:
    raise AssertionError("the template was rendered")


def test_a_template_that_renders_the_tools_and_speaks_tool_call_is_hermes():
    seen: list[dict] = []
    render = jinja(HERMES)

    def recording(**kw) -> str:
        seen.append(kw)
        return render(**kw)

    protocol = detect(recording, HERMES)
    assert isinstance(protocol, HermesTools) and not isinstance(protocol, HarmonyTools)
    assert protocol.name == "hermes"
    ((probe,),) = [kw["tools"] for kw in seen]
    assert probe["function"]["name"] == PROBE_TOOL == "tokenspool_probe_tool"
    assert seen[0]["messages"] == [{"role": "user", "content": "x"}]


def test_a_template_that_speaks_tool_call_but_drops_the_tools_gets_the_json_envelope():
    """SmolLM2-like: `<tool_call>` in an example, but the tools never reach the prompt."""
    template = "{# a model taught <tool_call> elsewhere #}" + MESSAGES
    protocol = detect(jinja(template), template)
    assert isinstance(protocol, JsonTools) and protocol.name == "json"


def test_a_template_that_cannot_take_tools_gets_the_json_envelope():
    template = (
        "{% if tools %}{{ raise_exception('tools are not supported') }}{% endif %}<tool_call>" + MESSAGES
    )
    assert isinstance(detect(jinja(template), template), JsonTools)
    assert isinstance(detect(lambda **kw: 1 / 0, "<tool_call>"), JsonTools)  # any failure, not only jinja's


def test_a_template_without_tool_call_is_never_rendered_and_gets_the_json_envelope():
    assert isinstance(detect(never, MESSAGES), JsonTools)
    assert isinstance(detect(never, "{{ tools | tojson }}" + MESSAGES), JsonTools)  # tools, but no tag


def test_gpt_oss_s_channels_and_call_marker_make_it_harmony_without_a_render():
    template = (
        f"{{% if tools %}}functions{{% endif %}}{harmony.CHANNEL}commentary to=functions.x{harmony.CALL}"
    )
    protocol = detect(never, template)
    assert isinstance(protocol, HarmonyTools) and protocol.name == "harmony"
    both = template + HERMES  # harmony's markers win over a `<tool_call>` it also holds
    assert isinstance(detect(never, both), HarmonyTools)


@pytest.mark.parametrize("marker", [harmony.CHANNEL, harmony.CALL])
def test_one_harmony_marker_alone_is_not_harmony(marker):
    assert isinstance(detect(never, marker + MESSAGES), JsonTools)
    protocol = detect(jinja(marker + HERMES), marker + HERMES)
    assert isinstance(protocol, HermesTools) and not isinstance(protocol, HarmonyTools)
