"""A non-strict tool's schema, loosened to what the grammar can enforce.

The Messages API's tools without `strict` have such schemas, written for a validator. The
allow-list of contract/schema.py says what stays."""

from __future__ import annotations

import json

from contract import schema

_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_RANGES = schema.BY_TYPE["integer"]
_ALL_TYPED = frozenset().union(*schema.BY_TYPE.values())
# every keyword the compiler reads
_SPOKEN = schema.KNOWN | schema.ANNOTATIONS | schema.CONTAINERS


def loosened(value: object) -> object:
    """A copy of the schema `value` without the constraints the grammar cannot enforce. The rest is
    then still enforced. Those dropped are a `pattern`, an unsupported `format` and a number's
    range. So are a keyword it does not know and a count above `MAX_BOUND`. So are a combinator
    beside other keywords and an `allOf` of several schemas. Each drop widens what the schema
    accepts, never narrows it. It makes one pass over the schema. What stays unenforceable otherwise
    is left for `schema_grammar` to refuse, naming where."""
    return _loosen(json.loads(json.dumps(value)), 0) if isinstance(value, dict) else value


def _loosen(node: dict, depth: int) -> dict:
    if depth > schema.MAX_DEPTH:
        return node
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    typed = set().union(*(schema.BY_TYPE[t] for t in types if t in schema.BY_TYPE)) if types else None
    if typed is not None and "number" in types:
        # a number's range cannot be spelled digit by digit
        typed -= _RANGES
    for key in list(node):
        unknown = (
            key in schema.UNENFORCEABLE or key not in schema.KNOWN | schema.ANNOTATIONS | schema.CONTAINERS
        )
        misplaced = typed is not None and key in _ALL_TYPED and key not in typed
        if (unknown and not (typed and key in typed)) or misplaced:
            del node[key]
    fmt = node.get("format")
    if fmt is not None and (fmt not in schema.FORMATS or "minLength" in node or "maxLength" in node):
        del node["format"]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _loosen(node[key], depth + 1)
    for key in _SUBSCHEMA_LISTS:
        for sub in node.get(key) if isinstance(node.get(key), list) else ():
            if isinstance(sub, dict):
                _loosen(sub, depth + 1)
    for key in _SUBSCHEMA_MAPS:
        for sub in node.get(key).values() if isinstance(node.get(key), dict) else ():
            if isinstance(sub, dict):
                _loosen(sub, depth + 1)
    for key in _COUNTS:
        value = node.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > schema.MAX_BOUND:
            del node[key]
    _mend_combinators(node)
    return node


_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def _mend_combinators(node: dict) -> None:
    """A branch loosening emptied allows any value. An `allOf` leaves such a branch out. An `anyOf`
    or `oneOf` that has one allows anything, and goes. A combinator the grammar cannot enforce also
    goes, and the rest is enforced. Such a combinator is an `allOf` of several schemas, or any
    combinator beside other keywords."""
    for key in ("allOf", "oneOf", "anyOf"):
        branches = node.get(key)
        if not isinstance(branches, list):
            continue
        empty = [b for b in branches if isinstance(b, dict) and not set(b) - schema.ANNOTATIONS]
        if key == "allOf":
            node[key] = branches = [b for b in branches if b not in empty]
        others = set(node) - schema.ANNOTATIONS - schema.CONTAINERS - {key}
        if not branches or (empty and key != "allOf") or others or (key == "allOf" and len(branches) > 1):
            del node[key]
