"""api.endpoints.loosening: a non-strict tool's schema keeps what the grammar can enforce, and
each drop only widens what it accepts."""

from __future__ import annotations

import json

import pytest

from api.endpoints.loosening import loosened
from contract.gbnf import SchemaError
from contract.schema import schema_grammar


def test_loosened_drops_only_what_the_grammar_cannot_enforce():
    """A validator's schema (zod's, as Claude Code's tools are written) keeps everything the
    grammar can hold; the original is not changed."""
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "url": {"type": "string", "format": "uri", "description": "d"},
            "pattern": {"type": "string", "pattern": "^a+$"},  # a property named like a keyword
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
            "count": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "mode": {"enum": ["a", "b"]},
        },
        "required": ["url", "pattern"],
    }
    before = json.dumps(schema)
    out = loosened(schema)
    assert json.dumps(schema) == before
    assert out["properties"] == {
        "url": {"type": "string", "description": "d"},
        "pattern": {"type": "string"},
        "timeout": {"type": "number"},
        "count": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string"}},
        "mode": {"enum": ["a", "b"]},
    }
    assert out["required"] == ["url", "pattern"] and out["additionalProperties"] is False
    schema_grammar(out)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/missing"},
        {"minLength": 2},  # a keyword without its type: which type was meant is not known
    ],
)
def test_loosened_leaves_what_it_cannot_mend_for_the_grammar_to_refuse(schema):
    assert loosened(schema) == schema
    with pytest.raises(SchemaError):
        schema_grammar(schema)


@pytest.mark.parametrize(
    ("schema", "out"),
    [
        # Claude Code's SendMessage: each pattern goes, then the emptied allOf
        ({"type": "string", "allOf": [{"pattern": "^a"}, {"pattern": "b$"}]}, {"type": "string"}),
        # a combinator beside other keywords: the grammar keeps the others
        (
            {"type": "string", "anyOf": [{"type": "string"}], "description": "d"},
            {"type": "string", "description": "d"},
        ),
        ({"type": "object", "oneOf": [{"required": ["a"]}]}, {"type": "object"}),
        # an intersection of two schemas: neither alone is it
        ({"allOf": [{"type": "string"}, {"type": "string", "minLength": 1}]}, {}),
        # an alternative emptied by loosening allows any value
        (
            {"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "integer"}]},
            {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        ),
        ({"anyOf": [{"pattern": "^a"}, {"type": "integer"}]}, {}),
        ({"allOf": [{"pattern": "^a"}, {"type": "integer"}]}, {"allOf": [{"type": "integer"}]}),
        # counts past what llama.cpp's grammar parser takes
        ({"type": "string", "minLength": 1, "maxLength": 524288}, {"type": "string", "minLength": 1}),
        ({"type": "array", "minItems": 5000}, {"type": "array"}),
    ],
)
def test_loosened_mends_what_the_grammar_would_refuse_by_dropping_constraints(schema, out):
    """Every mend drops a constraint, never adds one: what the schema accepts, the loosened one
    accepts too."""
    assert loosened(schema) == out
    schema_grammar(out)
