"""api/endpoints/structured.py: tools, tool choices, custom tools' formats and response formats
checked the same way for every endpoint: what the grammar cannot enforce is a 400 naming the
parameter and where in it."""

from __future__ import annotations

import pytest

from api.endpoints.structured import checked_choice, checked_custom, checked_format, checked_tools
from api.http.errors import APIError
from contract.jobspec import Tool
from contract.schema import MAX_SCHEMA_BYTES

WHERE = "tools[{}].function"


def refused(fn, *args, **kwargs) -> APIError:
    with pytest.raises(APIError) as info:
        fn(*args, **kwargs)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_tools_are_compiled_with_an_empty_object_schema_and_no_description_by_default():
    tools = checked_tools(
        [
            ("get_weather", "The weather.", {"type": "object", "properties": {"city": {"type": "string"}}}),
            ("now", None, None),
        ],
        WHERE,
    )
    assert tools == (
        Tool("get_weather", "The weather.", {"type": "object", "properties": {"city": {"type": "string"}}}),
        Tool("now", "", {"type": "object", "properties": {}}),
    )


@pytest.mark.parametrize("name", ["", "has space", "dot.ted", "x" * 65, "naïve"])
def test_a_tool_name_outside_openais_rule_is_refused_naming_the_tools_name(name):
    e = refused(checked_tools, [("ok", None, None), (name, None, None)], WHERE)
    assert e.param == "tools[1].function.name"
    assert repr(name[:64]) in e.message


def test_a_long_bad_name_is_quoted_only_to_64_characters():
    e = refused(checked_tools, [("y" * 70 + " ", None, None)], WHERE)
    assert repr("y" * 64) in e.message and "y" * 65 not in e.message


def test_a_schema_the_grammar_cannot_enforce_names_the_tool_and_the_keyword():
    bad = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}}
    e = refused(checked_tools, [("ok", None, None), ("f", None, bad)], WHERE)
    assert e.param == "tools[1].function.parameters"
    assert "/properties/code/pattern" in e.message and "regular expressions are not supported" in e.message


def test_the_index_given_and_the_schema_field_name_the_tool_as_the_request_numbers_it():
    """The Messages API's tools sit among others (`at`), their schema is `input_schema`."""
    defs = [("ok", None, None), ("f", None, {"type": "nope"})]
    e = refused(checked_tools, defs, "tools[{}]", "input_schema", at=[3, 7])
    assert e.param == "tools[7].input_schema"


def test_function_names_must_be_unique():
    e = refused(checked_tools, [("f", None, None), ("g", None, None), ("f", "again", None)], WHERE)
    assert e.param == "tools" and "unique" in e.message


def test_a_schema_too_large_or_too_deep_is_a_400_not_a_crash():
    big = {"type": "object", "properties": {"a": {"type": "string", "description": "x" * MAX_SCHEMA_BYTES}}}
    e = refused(checked_tools, [("f", None, big)], WHERE)
    assert e.param == "tools[0].function.parameters" and f"at most {MAX_SCHEMA_BYTES}" in e.message
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    assert "nested deeper than 32 levels" in refused(checked_tools, [("f", None, deep)], WHERE).message
    deeper: dict = {"type": "object"}
    for _ in range(5000):  # past Python's recursion limit before the grammar's
        deeper = {"type": "object", "properties": {"a": deeper}}
    e = refused(checked_format, "json_schema", deeper, "response_format")
    assert e.param == "response_format" and "nested too deeply" in e.message


def test_a_tool_choice_defaults_to_auto_and_a_mode_passes_as_it_is():
    tools = checked_tools([("f", None, None)], WHERE)
    assert checked_choice(None, ()) == "auto"
    assert checked_choice(None, tools) == "auto"
    assert checked_choice("required", tools) == "required"
    assert checked_choice("none", tools) == "none"


def test_a_tool_choice_without_tools_is_refused():
    e = refused(checked_choice, "auto", ())
    assert e.param == "tool_choice" and "only allowed when 'tools' are specified" in e.message


def test_a_named_choice_must_name_one_of_the_tools_of_its_kind():
    plain = checked_tools([("f", None, None)], WHERE)[0]
    custom = checked_custom(checked_tools([("c", None, None)], WHERE)[0], {"type": "text"}, "tools[1].format")
    tools = (plain, custom)
    assert checked_choice("f", tools, "tool_choice.function.name") == "function:f"
    assert checked_choice("c", tools, "tool_choice.name", custom=True) == "function:c"
    e = refused(checked_choice, "c", tools, "tool_choice.function.name")  # a custom tool is no function
    assert e.param == "tool_choice.function.name" and "no tool named 'c'" in e.message
    e = refused(checked_choice, "f", tools, "tool_choice.name", custom=True)
    assert e.param == "tool_choice.name" and "no custom tool named 'f'" in e.message


def test_a_custom_tool_keeps_its_format_and_tells_the_model_what_its_input_is():
    text = checked_custom(Tool("notes", "Take notes."), {"type": "text"}, "p")
    assert text.freeform == {"type": "text"}
    assert text.description == "Take notes.\n\nIts argument `input` is free text."
    regex = {"type": "grammar", "syntax": "regex", "definition": "[0-9]+"}
    digits = checked_custom(Tool("digits"), regex, "p")
    assert digits.freeform == regex and digits.name == "digits"
    assert digits.description == "Its argument `input` is text matching this regular expression:\n[0-9]+"
    lark = {"type": "grammar", "syntax": "lark", "definition": 'start: "a" | "b"'}
    assert checked_custom(Tool("ab"), lark, "p").description.startswith(
        "Its argument `input` is text matching this Lark grammar:\n"
    )


@pytest.mark.parametrize(
    ("fmt", "says"),
    [
        ({"type": "json"}, "a format is {'type': 'text'}"),
        ({"type": "grammar", "syntax": "pcre", "definition": "x"}, "a grammar's syntax is one of"),
        ({"type": "grammar", "syntax": "regex", "definition": "(a*)*"}, "repeats without bound"),
    ],
)
def test_a_custom_format_the_grammar_cannot_enforce_is_a_400_naming_it(fmt, says):
    e = refused(checked_custom, Tool("t"), fmt, "tools[2].format")
    assert e.param == "tools[2].format" and says in e.message


def test_response_formats_text_json_object_and_json_schema():
    assert checked_format("text", {"ignored": True}, "rf") is None
    assert checked_format("json_object", None, "rf") == {"type": "json_object"}
    assert checked_format("json_schema", None, "rf") == {"type": "json_schema", "schema": {"type": "object"}}
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    assert checked_format("json_schema", schema, "rf") == {"type": "json_schema", "schema": schema}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"n": {"type": "number", "minimum": 1}}}, "/properties/n/minimum"),
        (False, "a schema of false allows no value"),
        ([], "a schema must be an object"),
        ({"type": "object", "required": ["x"], "properties": {}}, "'x' is required but not among"),
    ],
)
def test_a_response_schema_the_grammar_cannot_enforce_names_where(schema, says):
    e = refused(checked_format, "json_schema", schema, "response_format.json_schema.schema")
    assert e.param == "response_format.json_schema.schema" and says in e.message
