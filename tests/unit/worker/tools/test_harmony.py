"""worker/tools/harmony.py: gpt-oss's tool protocol: what its template is given (a tool result
escaped for its quotes), when its grammar holds (a call forced from the first token, a response
format from the `final` header), what that grammar takes (held against llama.cpp's grammar
engine), and whose calls its reader takes."""

from __future__ import annotations

import pytest

from contract.jobspec import NAMED, JobSpec, Message, Tool, ToolCall
from tests.unit.worker.reading import CID, calls, run
from worker.text import harmony
from worker.text.replies import PlainReply, call_id
from worker.tools.harmony import FINAL, HarmonyTools

WEATHER = Tool(
    "get_weather",
    "Weather of a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = Tool("get_time")
ASK = (Message("user", "Weather in Oslo?"),)
ANSWER_SCHEMA = {
    "type": "json_schema",
    "schema": {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]},
}


def spec(**kw) -> JobSpec:
    return JobSpec(id=CID, kind="chat", model="gpt-oss", **{"messages": ASK, **kw})


def call(name: str, args: str) -> str:
    return f"{harmony.CHANNEL}commentary to=functions.{name} {harmony.CONSTRAIN}json{harmony.MESSAGE}{args}"


THINK = (  # a thinking message the model writes before its call
    f"{harmony.CHANNEL}analysis{harmony.MESSAGE}They want Oslo's weather."
    f"{harmony.END}{harmony.START}assistant"
)


@pytest.mark.parametrize(
    ("kw", "trigger"),
    [
        ({}, None),
        ({"tools": (WEATHER,)}, None),
        ({"response_format": ANSWER_SCHEMA}, FINAL),
        ({"tools": (WEATHER,), "response_format": ANSWER_SCHEMA}, FINAL),
        ({"tools": (WEATHER,), "tool_choice": "required", "response_format": ANSWER_SCHEMA}, None),
        ({"tools": (WEATHER,), "tool_choice": NAMED + "get_weather"}, None),
    ],
    ids=["plain", "auto", "format", "auto-format", "required", "named"],
)
def test_a_response_format_holds_from_the_final_header_and_a_forced_call_from_the_start(kw, trigger):
    assert FINAL == "<|channel|>final"
    assert HarmonyTools().trigger(spec(**kw)) == trigger


def test_with_auto_and_no_response_format_the_model_is_not_constrained():
    assert HarmonyTools().grammar(spec(tools=(WEATHER, TIME))) is None
    assert HarmonyTools().grammar(spec()) is None


def test_a_forced_call_is_one_of_the_offered_tools_with_arguments_to_its_schema(accepts):
    gbnf = HarmonyTools().grammar(spec(tools=(WEATHER, TIME), tool_choice="required"))
    assert accepts(gbnf, call("get_weather", '{"city": "Oslo"}'))
    assert accepts(gbnf, call("get_time", "{}"))
    assert accepts(gbnf, THINK + call("get_weather", '{"city": "Oslo"}'))  # thinking first, free
    assert not accepts(gbnf, call("get_weather", '{"town": "Oslo"}'))  # not its schema
    assert not accepts(gbnf, call("get_news", "{}"))  # not offered
    assert not accepts(gbnf, f"{harmony.CHANNEL}final{harmony.MESSAGE}It is sunny.")  # an answer


def test_a_named_tool_is_the_only_call_taken(accepts):
    gbnf = HarmonyTools().grammar(spec(tools=(WEATHER, TIME), tool_choice=NAMED + "get_time"))
    assert accepts(gbnf, call("get_time", "{}"))
    assert not accepts(gbnf, call("get_weather", '{"city": "Oslo"}'))


def test_a_prompt_that_opened_the_analysis_message_leaves_only_its_body_free(accepts):
    gbnf = HarmonyTools().grammar(spec(tools=(WEATHER,), tool_choice="required"), opened="analysis")
    body = "Oslo, then. 2 > 1."
    assert accepts(
        gbnf, body + harmony.END + harmony.START + "assistant" + call("get_weather", '{"city": "O"}')
    )
    assert accepts(
        gbnf, body + harmony.START + "assistant" + call("get_weather", '{"city": "O"}')
    )  # no <|end|>
    assert not accepts(gbnf, call("get_weather", '{"city": "O"}'))  # the thinking must end first
    assert not accepts(gbnf, "a <b" + harmony.START + "assistant" + call("get_weather", '{"city": "O"}'))


def test_a_response_format_is_the_final_message_s_body_under_either_header(accepts):
    tools = HarmonyTools()
    gbnf = tools.grammar(spec(response_format=ANSWER_SCHEMA))
    assert accepts(gbnf, f"{FINAL}{harmony.MESSAGE}" + '{"answer": 3}')
    assert accepts(gbnf, f"{FINAL} {harmony.CONSTRAIN}json{harmony.MESSAGE}" + '{"answer": 3}')
    assert not accepts(gbnf, f"{FINAL}{harmony.MESSAGE}" + '{"answer": "three"}')
    assert not accepts(gbnf, '{"answer": 3}')  # the header comes first (the trigger is in it)
    assert accepts(
        tools.grammar(spec(response_format={"type": "json_object"})), f"{FINAL}{harmony.MESSAGE}{{}}"
    )


def test_a_tool_result_is_escaped_for_the_quotes_the_template_puts_it_between():
    history = (
        *ASK,
        Message("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
        Message("tool", 'He said "sunny"\nand 5\\6, déjà', tool_call_id="call_1"),
        Message("tool", "", tool_call_id="call_2"),
        Message("user", 'Say "thanks"\n'),
    )
    out, extra = HarmonyTools().messages(spec(messages=history, tools=(WEATHER,)))
    assert out[2] == {
        "role": "tool",
        "content": 'He said \\"sunny\\"\\nand 5\\\\6, déjà',
        "tool_call_id": "call_1",
    }
    assert out[3]["content"] == ""
    assert out[4] == {"role": "user", "content": 'Say "thanks"\n'}  # only tool results are escaped
    assert out[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert [t["function"]["name"] for t in extra["tools"]] == ["get_weather"]


def test_sent_back_thinking_goes_to_the_template_as_thinking():
    history = (*ASK, Message("assistant", "Sunny.", reasoning="Look it up."), Message("user", "Thanks"))
    out, _ = HarmonyTools().messages(spec(messages=history))
    assert out[1] == {"role": "assistant", "content": "Sunny.", "thinking": "Look it up."}


@pytest.mark.parametrize("seed", range(4))
def test_the_reader_takes_calls_of_offered_tools_only(seed):
    text = THINK + call("get_weather", '{"city": "Oslo"}')
    tools = HarmonyTools()
    offered = spec(tools=(WEATHER, TIME))
    reader = tools.reader(offered, tools.reply(offered), None)
    out = run(reader, text, seed)
    assert calls(out) == [{"id": call_id(CID, 0), "name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert out.reasoning == "They want Oslo's weather." and out.content == ""
    for other in (spec(tools=(TIME,)), spec(tools=(WEATHER,), tool_choice="none"), spec()):
        out = run(tools.reader(other, PlainReply(), None), text, seed)  # a call it was not offered
        assert out.calls == [] and out.content == ""
        assert out.reasoning == 'They want Oslo\'s weather.{"city": "Oslo"}'


def test_a_named_tool_s_reader_takes_only_that_tool_and_an_opened_message_is_thinking():
    tools = HarmonyTools()
    named = spec(tools=(WEATHER, TIME), tool_choice=NAMED + "get_time")
    body = "Time, not weather." + harmony.START + "assistant"
    out = run(
        tools.reader(named, tools.reply(named), "analysis"), body + call("get_weather", '{"city": "O"}')
    )
    assert out.calls == [] and out.reasoning.startswith("Time, not weather.")
    out = run(tools.reader(named, tools.reply(named), "analysis"), body + call("get_time", "{}"))
    assert calls(out) == [{"id": call_id(CID, 0), "name": "get_time", "arguments": "{}"}]
    assert out.reasoning == "Time, not weather." and tools.reply(named).feed("x").content == "x"
