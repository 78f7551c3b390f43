"""contract/schema.py: what a schema compiles to, and every refusal naming where it is.
(That the grammars hold against real output, through llama.cpp's grammar sampler, is
tests/integration/test_tools.py's part.)"""

from __future__ import annotations

import json
import math
import re
import tracemalloc

import pytest

from contract.gbnf import SchemaError, json_object_grammar, literal
from contract.schema import MAX_BOUND, MAX_SCHEMA_BYTES, schema_grammar


@pytest.mark.parametrize(
    ("schema", "where", "words"),
    [
        ({"type": "number", "minimum": 1}, "/minimum", "integers only"),
        ({"type": ["integer", "number"], "maximum": 1}, "/maximum", "integers only"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "", "no integer"),
        ({"type": "integer", "minimum": 10**17}, "", "16 digits"),
        ({"type": "number", "multipleOf": 2}, "/multipleOf", "not supported"),
        ({"type": "string", "pattern": "^a+$"}, "/pattern", "regular expressions"),
        ({"not": {"type": "string"}}, "/not", "negation"),
        ({"type": "object", "properties": {"a": {"if": {}}}}, "/properties/a/if", "not supported"),
        ({"$ref": "#/$defs/missing"}, "/$ref", "points nowhere"),
        ({"$ref": "https://example.com/s.json"}, "/$ref", ""),
        ({"type": "array", "items": {"type": "string"}, "maxItems": MAX_BOUND + 1}, "/maxItems", "at most"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, "/required", ""),
        ({"type": "frobnicate"}, "/type", ""),
        ({"x-custom": 1}, "/x-custom", "not supported"),
    ],
)
def test_what_the_grammar_cannot_enforce_is_refused_where_it_is(schema, where, words):
    with pytest.raises(SchemaError) as info:
        schema_grammar(schema)
    assert info.value.where == where, str(info.value)
    assert words in str(info.value)


def _as_regex(alternatives: str) -> re.Pattern:
    """The GBNF of an integer range (literals, classes, {n}) as a Python regex."""
    body = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), alternatives).replace(" ", "")
    return re.compile(f"(?:{body})")


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0, "maximum": 120},
        {"minimum": -5, "maximum": 5},
        {"minimum": -300, "maximum": -20},
        {"minimum": 17},
        {"maximum": 42},
        {"exclusiveMinimum": 0},
        {"minimum": 1, "exclusiveMaximum": 1000},
        {"minimum": 95, "maximum": 1005},
        {"minimum": 0.5, "maximum": 9.5},
        {"maximum": -3},
    ],
)
def test_an_integer_range_admits_exactly_its_integers_without_leading_zeros(bounds):
    """pydantic's ge/gt/le/lt: checked against every integer from -3000 to 3000."""
    rule = next(
        line.split("::=", 1)[1].strip()
        for line in schema_grammar({"type": "integer", **bounds}).splitlines()
        if line.startswith("r ::=")
    )
    allowed = _as_regex(rule.removeprefix("(").removesuffix(") ws"))
    lo = bounds.get("minimum", bounds.get("exclusiveMinimum", -math.inf))
    hi = bounds.get("maximum", bounds.get("exclusiveMaximum", math.inf))
    for v in range(-3000, 3001):
        inside = (v >= lo if "exclusiveMinimum" not in bounds else v > lo) and (
            v <= hi if "exclusiveMaximum" not in bounds else v < hi
        )
        assert bool(allowed.fullmatch(str(v))) == inside, v
    assert not any(allowed.fullmatch(t) for t in ("00", "01", "-0", "007", "-01", "+1"))


def test_a_schema_too_large_is_refused_before_it_is_compiled():
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    with pytest.raises(SchemaError, match="bytes"):
        schema_grammar(big)


def test_required_properties_come_first_in_declaration_order_then_the_optional_ones():
    g = schema_grammar(
        {
            "type": "object",
            "properties": {"opt": {"type": "boolean"}, "a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["b", "a"],
        }
    )
    root = next(line for line in g.splitlines() if line.startswith("r ::="))
    assert root.index(r"\"a\"") < root.index(r"\"b\"") < root.index(r"\"opt\"")  # declaration order
    assert root.count(r"\"opt\"") == 1


def test_bounds_become_bounded_repetitions():
    g = schema_grammar(
        {
            "type": "array",
            "items": {"type": "string", "minLength": 2, "maxLength": 5},
            "minItems": 1,
            "maxItems": 3,
        }
    )
    assert "{2,5}" in g or "{2,5}" in g.replace(" ", "")
    assert '"["' in g and '"]"' in g


def test_enum_and_const_are_the_json_texts_of_their_values():
    g = schema_grammar({"enum": ["C", "F", 1, None]})
    for text in (literal('"C"'), literal('"F"'), literal("1"), literal("null")):
        assert text in g
    assert literal('"x\\"y"') in schema_grammar({"const": 'x"y'})


def test_recursion_through_a_local_ref_is_one_rule_not_an_unrolling():
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    }
    g = schema_grammar(schema)
    assert len(g) < 2000


def test_annotations_change_nothing():
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    annotated = {
        "title": "T",
        "description": "d",
        "type": "object",
        "properties": {"a": {"type": "integer", "title": "A", "examples": [1]}},
        "required": ["a"],
    }
    assert schema_grammar(plain) == schema_grammar(annotated)


def test_json_object_is_any_object_and_strings_hold_no_raw_control_character():
    g = json_object_grammar()
    assert g.startswith("root ::= object")
    char = next(line for line in g.splitlines() if line.startswith("char ::="))
    assert r"\x00-\x1F" in char


def _optional(n: int) -> dict:
    return {"type": "object", "properties": {str(i): {} for i in range(n)}}


def test_optional_properties_grow_the_grammar_linearly_and_it_is_bounded_while_built():
    small, large = len(schema_grammar(_optional(100))), len(schema_grammar(_optional(1000)))
    assert large < 12 * small  # ten times the properties: about ten times the grammar, not 100
    # As many optional properties as MAX_SCHEMA_BYTES holds (issue 38: quadratic, GBs, seconds):
    # refused for its grammar's size after a bounded amount of work, measured while it is built.
    most = _optional(5000)
    while len(json.dumps(most)) > MAX_SCHEMA_BYTES:
        most = _optional(len(most["properties"]) - 100)
    tracemalloc.start()
    try:
        with pytest.raises(SchemaError, match="grammar over"):
            schema_grammar(most)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB to refuse a {MAX_SCHEMA_BYTES}-byte schema"
