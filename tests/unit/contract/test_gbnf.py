"""contract/gbnf.py: GBNF literals, the shared JSON primitives and formats (read back as Python regexes),
rule naming and the grammar's size limit, and the digit-by-digit spelling of integer ranges."""

from __future__ import annotations

import re

import pytest

from contract import gbnf
from contract.gbnf import MAX_GRAMMAR_CHARS, Grammar, SchemaError

_TOKEN = re.compile(
    r'(?P<lit>"(?:\\.|[^"\\])*")|(?P<cls>\[(?:\\.|[^\]\\])*\])|(?P<rep>\{[0-9,]*\})'
    r"|(?P<ref>[a-zA-Z][a-zA-Z0-9-]*)|(?P<op>[()|?*+])|(?P<space>\s+)"
)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}


def _tokens(body: str) -> list[re.Match]:
    out, at = [], 0
    for m in _TOKEN.finditer(body):
        assert m.start() == at, f"not GBNF at {body[at:]!r}"
        out.append(m)
        at = m.end()
    assert at == len(body), f"not GBNF at {body[at:]!r}"
    return out


def _unescape(literal: str) -> str:
    def one(m: re.Match) -> str:
        code = m.group(1)
        return chr(int(code[1:], 16)) if code.startswith("x") else _ESCAPES.get(code, code)

    return re.sub(r"\\(x[0-9A-Fa-f]{2}|.)", one, literal[1:-1])


def _regex(body: str, rules: dict[str, str], depth: int = 0) -> str:
    """A non-recursive GBNF expression as a Python regex, its rule references inlined."""
    assert depth < 10, "a recursive rule"
    out = []
    for m in _tokens(body):
        kind, text = m.lastgroup, m.group()
        if kind == "lit":
            out.append(re.escape(_unescape(text)))
        elif kind == "ref":
            out.append(f"(?:{_regex(rules[text], rules, depth + 1)})")
        elif kind != "space":
            out.append(text)
    return "".join(out)


def _rules(text: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in text.splitlines())


SHARED = _rules(gbnf.json_object_grammar())


def matcher(rule: str) -> re.Pattern:
    return re.compile(_regex(SHARED[rule], SHARED))


def test_a_literal_escapes_what_gbnf_would_misread_and_keeps_the_rest():
    assert gbnf.literal('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert gbnf.literal("a\nb\rc\td") == '"a\\nb\\rc\\td"'
    assert gbnf.literal("\x00\x1f\x7f") == '"\\x00\\x1F\\x7F"'
    assert gbnf.literal("café ✓") == '"café ✓"'
    for text in ('say "hi"\\', "a\nb\rc\td", "\x00\x1f\x7f", "café", ""):
        assert _unescape(gbnf.literal(text)) == text


def test_a_json_literal_is_the_compact_json_text_of_its_value():
    assert gbnf.json_literal({"a": [1, "x"], "b": None}) == '"{\\"a\\":[1,\\"x\\"],\\"b\\":null}"'
    assert gbnf.json_literal("é") == '"\\"é\\""'  # not \\u00e9: the model writes the character


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        ("integer", ["0", "-7", "1234567890123456", "10 "], ["01", "-", "1.0", "+1", "12345678901234567"]),
        ("number", ["0", "-0.5", "3.25e10", "1E-4", "2e+300"], ["01", ".5", "1.", "1e", "--1", "1e12345"]),
        ("string", ['""', '"a b"', '"\\"q\\""', '"\\u00e9"', '"é" '], ['"a', '"\\x"', '"\x01"', '"\\u12"']),
        ("boolean", ["true", "false "], ["True", "1"]),
        ("null", ["null"], ["nil", "None"]),
    ],
)
def test_the_json_primitives_admit_json_s_spellings_only(rule, good, bad):
    pattern = matcher(rule)
    assert [g for g in good if not pattern.fullmatch(g)] == []
    assert [b for b in bad if pattern.fullmatch(b)] == []


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date", ["2024-02-29", "1999-12-31"], ["2024-13-01", "2024-00-10", "2024-01-32", "24-01-01"]),
        ("time", ["23:59:59Z", "00:00:00.123456+05:30"], ["24:00:00Z", "12:60:00Z", "12:00:00", "1:00:00Z"]),
        ("date-time", ["2024-01-02T03:04:05-08:00"], ["2024-01-02 03:04:05Z", "2024-01-02T03:04:05"]),
        ("uuid", ["123e4567-e89b-12d3-A456-426614174000"], ["123e4567e89b12d3a456426614174000", "g" * 36]),
    ],
)
def test_the_string_formats_admit_their_rfc_3339_and_uuid_shapes(fmt, good, bad):
    pattern = re.compile(_regex(gbnf.FORMAT_RULES[fmt], SHARED))
    assert [g for g in good if not pattern.fullmatch(g)] == []
    assert [b for b in bad if pattern.fullmatch(b)] == []


def test_the_json_object_grammar_starts_at_an_object_and_defines_every_rule_it_names():
    text = gbnf.json_object_grammar()
    assert text.splitlines()[0] == "root ::= object"
    assert text.endswith("\n")
    for name, body in SHARED.items():
        named = {m.group() for m in _tokens(body) if m.lastgroup == "ref"}
        assert named <= SHARED.keys(), name


def test_rule_names_are_cleaned_numbered_apart_and_never_a_shared_rule_s():
    g = Grammar()
    assert g.name("My Tool.Name!") == "my-tool-name"
    assert g.name("my tool name") == "my-tool-name-2"
    assert g.name("My_Tool-Name") == "my-tool-name-3"
    assert g.name("string") == "string-2"  # a shared rule's name
    assert g.name("root") == "root-2"
    assert g.name("!!!") == "r"
    assert g.name("my-tool-name-2") == "my-tool-name-2-2"  # a hint that looks numbered


def test_the_rules_built_come_after_root_and_before_the_shared_ones():
    def build(g: Grammar) -> str:
        item = g.define(g.name("item"), '"x" ws')
        return g.define(g.name("list"), f'"[" {gbnf.repeat(item, 1, 2)} "]"')

    text = gbnf.composed(build)
    names = [line.split(" ::= ")[0] for line in text.splitlines()]
    assert names[:3] == ["root", "item", "list"]
    assert text.splitlines()[0] == "root ::= list"
    rules = _rules(text)
    pattern = re.compile(_regex(rules["root"], rules))
    assert [s for s in ("[x]", "[x ,x ]", "[x,x]") if pattern.fullmatch(s)] == ["[x]", "[x ,x ]", "[x,x]"]
    assert not pattern.fullmatch("[]") and not pattern.fullmatch("[x,x,x]")


def test_a_grammar_over_the_limit_is_refused_as_it_grows():
    g = Grammar()
    g.define("big", "x" * (MAX_GRAMMAR_CHARS - len("big") - 6))  # exactly at the limit
    with pytest.raises(SchemaError, match="over 262144 characters") as info:
        g.define("more", '"y"')
    assert info.value.where == "" and str(info.value).startswith("(root): ")
    with pytest.raises(SchemaError):  # with the shared rules, the text itself is over
        g.text("big")
    assert len(Grammar().text("object")) < MAX_GRAMMAR_CHARS


def _range(lo: int, hi: int | None) -> re.Pattern:
    return re.compile("|".join(f"(?:{_regex(alt, {})})" for alt in gbnf.digits(lo, hi)))


@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (0, 9), (3, 3), (7, 123), (10, 99), (95, 1005), (199, 200)])
def test_digits_spell_exactly_the_integers_of_a_range_without_leading_zeros(lo, hi):
    pattern = _range(lo, hi)
    admitted = [n for n in range(0, 2100) if pattern.fullmatch(str(n))]
    assert admitted == list(range(lo, hi + 1))
    assert not any(pattern.fullmatch(s) for s in ("00", "007", "0" + str(hi), "-1"))


def test_digits_without_an_upper_bound_go_up_to_sixteen_digits():
    pattern = _range(42, None)
    assert not pattern.fullmatch("41") and pattern.fullmatch("42") and pattern.fullmatch("100")
    assert pattern.fullmatch("9" * 16) and not pattern.fullmatch("1" + "0" * 16)


def test_repeat_separates_items_by_commas_within_its_bounds():
    assert gbnf.repeat("x", 0, 0) == ""
    assert gbnf.repeat("x", 1, None) == 'x ("," ws x){0,}'
    assert gbnf.repeat("x", 0, 3) == '(x ("," ws x){0,2})?'
    assert gbnf.repeat("x", 2, 2) == 'x ("," ws x){1,1}'
    rules = {**SHARED, "x": '"x"'}
    pattern = re.compile(_regex(gbnf.repeat("x", 2, 4), rules))
    admitted = [n for n in range(7) if pattern.fullmatch(",".join("x" * n))]
    assert admitted == [2, 3, 4]
