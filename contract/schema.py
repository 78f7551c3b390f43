"""JSON schemas as llama.cpp grammars (GBNF): what structured output can ask for, both sides.

The API compiles a request's schema (`response_format`, a tool's `parameters`) before it
enqueues anything. A keyword the grammar cannot enforce is a 400 naming where it is
(`SchemaError`). It is never a silent fallback to free text or to a looser grammar. The job
keeps the schema. The worker compiles it again into the grammar its sampler enforces. So a
continuation on another worker enforces the same one.

An allow-list, not a deny-list: anything not named here is refused. So a keyword this code
does not know fails closed. What is enforced:

- `type` (one, or a list: any of them), `enum`, `const`, `anyOf`. `oneOf` too, enforced as
  `anyOf`: the output matches at least one branch. `allOf` of one schema. Local `$ref`
  (`#/...`, recursion included), and `$defs`/`definitions`.
- Objects: `properties`, `required` (names among the properties), `additionalProperties`.
  Absent or false, `additionalProperties` allows no other key. True or a schema, it allows
  other keys of that value. Required properties come first, in declaration order, then the
  optional ones.
- Arrays: `items`, `prefixItems` (the tuple exactly), `minItems`/`maxItems`.
- Strings: `minLength`/`maxLength`, and `format` date, time, date-time or uuid.
- Integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (pydantic's `ge`,
  `le`, `gt`, `lt`). The range is enforced as digit-by-digit alternatives. Integers have up
  to 16 digits, as always.
- Numbers: any value. Ranges are refused: a decimal's bounds cannot be spelled digit by digit.
- Annotations (`title`, `description`, `default`, `examples`, ...) change nothing.

The grammar's whitespace is at most one space between tokens. Its strings never hold a raw
control character, which JSON forbids. Bounds keep llama.cpp's grammar parser safe: it
recurses, and it refuses a repetition above 2,000. Counts go up to `MAX_BOUND`, and nesting
up to `MAX_DEPTH`. A schema has at most `MAX_SCHEMA_BYTES`, and a grammar at most
`MAX_GRAMMAR_CHARS`.
"""

from __future__ import annotations

import json
import math

from contract.gbnf import (
    ANY,
    FORMAT_RULES,
    MAX_DIGITS,
    Grammar,
    SchemaError,
    digits,
    json_literal,
    repeat,
)

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_BOUND = 1000
MAX_ENUM = 1000

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$schema",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
        # OpenAPI's hint beside a oneOf (pydantic emits it): the branches decide
        "discriminator",
    }
)
CONTAINERS = frozenset({"$defs", "definitions"})
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
BY_TYPE = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "format"}),
    "number": frozenset(),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "boolean": frozenset(),
    "null": frozenset(),
}
FORMATS = ("date", "time", "date-time", "uuid")
UNENFORCEABLE = {
    "pattern": "regular expressions are not supported",
    "minimum": "ranges are enforced on integers only",
    "maximum": "ranges are enforced on integers only",
    "exclusiveMinimum": "ranges are enforced on integers only",
    "exclusiveMaximum": "ranges are enforced on integers only",
    "multipleOf": "numeric constraints cannot be enforced by the grammar",
    "not": "negation cannot be enforced by the grammar",
    "if": "conditional schemas are not supported",
    "uniqueItems": "unique items cannot be enforced by the grammar",
    "patternProperties": "regular expressions are not supported",
}


class Compiler:
    """One schema's rules.

    `rule(node, where)` returns the name of (or the expression for) the rule matching `node`'s
    values. The rule takes optional whitespace after them."""

    def __init__(self, root: dict, grammar: Grammar, prefix: str = "") -> None:
        self._root = root
        self._g = grammar
        self._prefix = prefix
        self._refs: dict[str, str] = {}

    def rule(self, node: object, where: str = "", depth: int = 0) -> str:
        if depth > MAX_DEPTH:
            raise SchemaError(where, f"nested deeper than {MAX_DEPTH} levels")
        if node is True or node == {}:
            return ANY
        if node is False:
            raise SchemaError(where, "a schema of false allows no value")
        if not isinstance(node, dict):
            raise SchemaError(where, "a schema must be an object")
        keys = set(node) - ANNOTATIONS
        for unknown in sorted(keys - CONTAINERS - KNOWN):
            why = UNENFORCEABLE.get(unknown, "this keyword is not supported")
            raise SchemaError(f"{where}/{unknown}", f"'{unknown}' is not supported: {why}")
        for container in keys & CONTAINERS:
            defs = node[container]
            if not isinstance(defs, dict):
                raise SchemaError(f"{where}/{container}", f"'{container}' must be an object")
        keys -= CONTAINERS
        if "$ref" in keys:
            _alone(node, where, "$ref", keys)
            return self._ref(node["$ref"], f"{where}/$ref", depth)
        for combo in ("anyOf", "oneOf"):
            if combo in keys:
                _alone(node, where, combo, keys)
                branches = _list(node[combo], f"{where}/{combo}")
                return self._alternatives(
                    [self.rule(b, f"{where}/{combo}/{i}", depth + 1) for i, b in enumerate(branches)], where
                )
        if "allOf" in keys:
            _alone(node, where, "allOf", keys)
            parts = _list(node["allOf"], f"{where}/allOf")
            if len(parts) != 1:
                raise SchemaError(f"{where}/allOf", "'allOf' is supported with one schema only")
            return self.rule(parts[0], f"{where}/allOf/0", depth + 1)
        if "const" in keys:
            _alone(node, where, "const", keys - {"type"})
            return self._named(where, f"{json_literal(node['const'])} ws")
        if "enum" in keys:
            _alone(node, where, "enum", keys - {"type"})
            values = _list(node["enum"], f"{where}/enum")
            if len(values) > MAX_ENUM:
                raise SchemaError(f"{where}/enum", f"at most {MAX_ENUM} values")
            return self._named(where, "(" + " | ".join(json_literal(v) for v in values) + ") ws")
        types = node.get("type")
        if types is None:
            if keys:
                raise SchemaError(where, f"'{sorted(keys)[0]}' needs a 'type'")
            return ANY
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or not all(t in _TYPES for t in types):
            raise SchemaError(f"{where}/type", f"'type' must be one of {list(_TYPES)} or a list of them")
        extra = keys - {"type"} - set().union(*(BY_TYPE[t] for t in types))
        # a bound another type allows would be dropped for numbers
        if "number" in types:
            extra |= keys & BY_TYPE["integer"]
        if extra:
            kw = sorted(extra)[0]
            why = f": {UNENFORCEABLE[kw]}" if kw in UNENFORCEABLE else ""
            raise SchemaError(f"{where}/{kw}", f"'{kw}' does not apply to type {' or '.join(types)}{why}")
        rules = [self._typed(t, node, where, depth) for t in dict.fromkeys(types)]
        return rules[0] if len(rules) == 1 else self._alternatives(rules, where)

    def _named(self, where: str, body: str) -> str:
        return self._g.define(self._g.name(self._prefix + where.replace("/", "-")), body)

    def _alternatives(self, rules: list[str], where: str) -> str:
        return self._named(where, " | ".join(dict.fromkeys(rules)))

    def _ref(self, ref: object, where: str, depth: int) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(where, "only local references ('#/...') are supported")
        if ref in self._refs:
            return self._refs[ref]
        target: object = self._root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(where, f"the reference {ref!r} points nowhere")
        name = self._g.name(self._prefix + "ref-" + ref[1:])
        # before its body: a recursive reference names the rule
        self._refs[ref] = name
        self._g.define(name, self.rule(target, ref[1:], depth + 1))
        return name

    def _typed(self, kind: str, node: dict, where: str, depth: int) -> str:
        if kind == "object":
            return self._object(node, where, depth)
        if kind == "array":
            return self._array(node, where, depth)
        if kind == "string":
            return self._string(node, where)
        if kind == "integer" and BY_TYPE["integer"] & set(node):
            return self._named(where, f"({_integer_range(node, where)}) ws")
        return kind

    def _object(self, node: dict, where: str, depth: int) -> str:
        props = node.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError(f"{where}/properties", "'properties' must be an object")
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{where}/required", "'required' must be a list of property names")
        for name in required:
            if name not in props:
                raise SchemaError(f"{where}/required", f"'{name}' is required but not among the properties")
        extra = node.get("additionalProperties", False)
        if "properties" not in node and "additionalProperties" not in node:
            # a bare {"type": "object"}: any object
            extra = True
        pairs = {
            name: f'{json_literal(name)} ws ":" ws {self.rule(sub, f"{where}/properties/{name}", depth + 1)}'
            for name, sub in props.items()
        }
        must = [pairs[n] for n in props if n in required]
        may = [pairs[n] for n in props if n not in required]
        if extra is not False:
            value = self.rule(extra, f"{where}/additionalProperties", depth + 1)
            other = self._named(f"{where}-other", f'string ":" ws {value}')
            may.append(f'{other} ("," ws {other})*')
        if must:
            body = ' "," ws '.join(must) + "".join(f' ("," ws {p})?' for p in may)
        else:
            body = f"{self._chain(may, where)}?" if may else ""
        return self._named(where, f'"{{" ws {body} "}}" ws'.replace("ws  ", "ws "))

    def _chain(self, options: list[str], where: str) -> str:
        """Optional properties, in order, none of them required: any non-empty ordered subset.

        Two rules a property, so the grammar grows with the properties, not their square.
        `some_i` is one of the subsets of options i.. (its first, then `rest` of the later
        ones, or a subset of options i+1..). `rest_i` is any subset of options i.., each after
        a comma."""
        some = rest = ""
        for i in range(len(options) - 1, -1, -1):
            option = options[i]
            if not rest:
                some = self._named(f"{where}-some", option)
                rest = self._named(f"{where}-rest", f'("," ws {option})?')
                continue
            some = self._named(f"{where}-some", f"{option} {rest} | {some}")
            rest = self._named(f"{where}-rest", f'("," ws {option})? {rest}')
        return some

    def _array(self, node: dict, where: str, depth: int) -> str:
        lo, hi = _bound(node, "minItems", where, 0), _bound(node, "maxItems", where, None)
        if hi is not None and hi < lo:
            raise SchemaError(f"{where}/maxItems", "'maxItems' is below 'minItems'")
        if "prefixItems" in node:
            if "minItems" in node or "maxItems" in node or node.get("items", False) is not False:
                raise SchemaError(
                    f"{where}/prefixItems", "'prefixItems' is supported alone (the exact tuple)"
                )
            items = _list(node["prefixItems"], f"{where}/prefixItems")
            rules = [self.rule(s, f"{where}/prefixItems/{i}", depth + 1) for i, s in enumerate(items)]
            return self._named(where, '"[" ws ' + ' "," ws '.join(rules) + ' "]" ws')
        item = self.rule(node.get("items", True), f"{where}/items", depth + 1)
        return self._named(where, f'"[" ws {repeat(item, lo, hi)} "]" ws')

    def _string(self, node: dict, where: str) -> str:
        fmt = node.get("format")
        if fmt is not None:
            if fmt not in FORMATS:
                raise SchemaError(
                    f"{where}/format", f"format {fmt!r} is not supported (only {list(FORMATS)})"
                )
            if "minLength" in node or "maxLength" in node:
                raise SchemaError(f"{where}/format", "'format' is supported without length bounds")
            return self._named(where, f'"\\"" {FORMAT_RULES[fmt]} "\\"" ws')
        lo, hi = _bound(node, "minLength", where, 0), _bound(node, "maxLength", where, None)
        if lo == 0 and hi is None:
            return "string"
        if hi is not None and hi < lo:
            raise SchemaError(f"{where}/maxLength", "'maxLength' is below 'minLength'")
        count = f"{{{lo},{'' if hi is None else hi}}}"
        return self._named(where, f'"\\"" char{count} "\\"" ws')


KNOWN = frozenset({"$ref", "anyOf", "oneOf", "allOf", "const", "enum", "type"}.union(*BY_TYPE.values()))


def _integer_range(node: dict, where: str) -> str:
    """The integers within the node's bounds, as GBNF alternatives without leading zeros."""
    lo = hi = None
    for key, inclusive, lower in (
        ("minimum", True, True),
        ("exclusiveMinimum", False, True),
        ("maximum", True, False),
        ("exclusiveMaximum", False, False),
    ):
        if key not in node:
            continue
        value = node[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SchemaError(f"{where}/{key}", f"'{key}' must be a number")
        if lower:
            bound = math.ceil(value) if inclusive else math.floor(value) + 1
            lo = bound if lo is None else max(lo, bound)
        else:
            bound = math.floor(value) if inclusive else math.ceil(value) - 1
            hi = bound if hi is None else min(hi, bound)
    limit = 10**MAX_DIGITS - 1
    if (lo is not None and abs(lo) > limit) or (hi is not None and abs(hi) > limit):
        raise SchemaError(where, f"integer bounds beyond {MAX_DIGITS} digits are not supported")
    if lo is not None and hi is not None and lo > hi:
        raise SchemaError(where, "the bounds leave no integer")
    alts: list[str] = []
    # negative values: "-" then 1 .. -lo (or any)
    if lo is None or lo < 0:
        top = -hi if hi is not None and hi < 0 else 1
        alts += [f'"-" {a}' for a in digits(top, None if lo is None else -lo)]
    if hi is None or hi >= 0:
        alts += digits(max(lo or 0, 0), hi)
    return " | ".join(alts)


def _alone(node: dict, where: str, keyword: str, keys: set[str]) -> None:
    """`keyword` takes no sibling but annotations (they would be silently dropped)."""
    others = sorted(keys - {keyword})
    if others:
        raise SchemaError(f"{where}/{others[0]}", f"'{others[0]}' beside '{keyword}' is not supported")


def _list(value: object, where: str) -> list:
    if not isinstance(value, list) or not value:
        raise SchemaError(where, "must be a non-empty list")
    return value


def _bound(node: dict, key: str, where: str, default: int | None) -> int | None:
    value = node.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{where}/{key}", f"'{key}' must be a non-negative integer")
    if value > MAX_BOUND:
        raise SchemaError(f"{where}/{key}", f"'{key}' may be at most {MAX_BOUND}")
    return value


def check_size(schema: object, where: str = "") -> None:
    size = len(json.dumps(schema, ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(where, f"the schema is {size} bytes; at most {MAX_SCHEMA_BYTES}")


def schema_grammar(schema: object) -> str:
    """The GBNF grammar whose sentences are the JSON texts `schema` accepts, within the limits above.

    Raises SchemaError."""
    check_size(schema)
    g = Grammar()
    root = Compiler(schema if isinstance(schema, dict) else {}, g).rule(schema)
    return g.text(root)
