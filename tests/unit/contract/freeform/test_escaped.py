"""contract/freeform/escaped.py: a custom tool's grammar as the GBNF of its text inside a JSON
string, held against llama.cpp's own grammar engine (the worker's GrammarGate fed the
tokens of the JSON string): Codex's `apply_patch` grammar, verbatim, takes a real patch and
refuses malformed ones; a regular expression's grammar takes exactly what Python's `re`
matches; and what llama.cpp cannot run, or what is too large, is refused before."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pytest

from contract.freeform.escaped import MAX_REPEATS, check_format, escaped, string_rule
from contract.freeform.terms import FormatError
from contract.gbnf import MAX_GRAMMAR_CHARS, Grammar
from contract.schema import MAX_SCHEMA_BYTES

# codex-rs/core/src/tools/handlers/tool_apply_patch.lark (openai/codex), as Codex sends it
APPLY_PATCH = (Path(__file__).parent / "apply_patch.lark").read_text()
CODEX = {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH}

PATCH = """*** Begin Patch
*** Add File: hello.txt
+Hello world
+\tindented "quoted" \\ back
*** Update File: src/app.py
*** Move to: src/main.py
@@ def greet():
-print("Hi")
+print("Hello, world!")
 context
*** End of File
*** Delete File: obsolete.txt
*** End Patch
"""
MALFORMED = [
    PATCH.replace("*** End Patch\n", ""),  # no end
    PATCH.replace("*** Begin Patch\n", ""),  # no beginning
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    PATCH.replace("+Hello world", "Hello world"),  # an added line without its +
    PATCH.replace("*** Add File: hello.txt", "*** Add File: "),  # no file name
    PATCH.replace("*** Delete File", "*** Remove File"),
    PATCH + "more",  # text after the end
]


def grammar(fmt: dict) -> str:
    g = Grammar()
    return g.text(string_rule(fmt, g, "tool0-"))


def as_json(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def test_codex_apply_patch_grammar_takes_a_real_patch(accepts):
    gbnf = grammar(CODEX)
    assert accepts(gbnf, as_json(PATCH))
    assert accepts(gbnf, as_json(PATCH.removesuffix("\n")))  # end_patch: LF?
    assert accepts(gbnf, as_json("*** Begin Patch\n*** Update File: a.py\n*** End Patch"))  # change?


@pytest.mark.parametrize("patch", MALFORMED)
def test_codex_apply_patch_grammar_refuses_a_malformed_patch(accepts, patch):
    assert not accepts(grammar(CODEX), as_json(patch))


def test_the_grammar_is_over_the_escaped_text_never_the_raw_one(accepts):
    """A raw newline or quote inside the JSON string would end or break it."""
    gbnf = grammar(CODEX)
    raw = '"' + PATCH + '"'
    assert not accepts(gbnf, raw)
    assert not accepts(gbnf, as_json(PATCH).replace("\\n", "\n", 1))
    assert not accepts(gbnf, as_json(PATCH).replace('\\"', '"', 1))


@pytest.mark.parametrize(
    ("pattern", "texts"),
    [
        (r"[0-9]{3}-[0-9]{4}", ["555-1234", "55-1234", "555-12345", "abc-defg"]),
        (r"^(yes|no)$", ["yes", "no", "maybe", "yesno", ""]),
        (r"\d+(\.\d{1,2})?", ["3", "3.14", "3.141", "3.", ".5"]),
        (r"[^\n]*\n?", ["any text", "two\nlines", 'quo"te\\', "ends\n", "\t\x01\x7f"]),
        (r"(?:ab)+c*", ["ab", "ababcc", "abc", "a", "c"]),
        (r"\w+@\w+\.com", ["me@example.com", "me@.com", "é@x.com"]),
        (r".+", ["x", "", "a\nb", "ünïcödé ✓"]),
        (r"[\s\S]{2,3}", ["ab", "a\n", "abcd", "a"]),
        (r"a{2,}b{0,1}", ["aa", "aaab", "ab", "aabb"]),
        (r"[a\-z]", ["a", "-", "z", "b"]),
        (r"\x41\u00e9\.", ["Aé.", "Aéx"]),
    ],
)
def test_a_regex_grammar_takes_exactly_what_python_re_matches(accepts, pattern, texts):
    gbnf = grammar({"type": "grammar", "syntax": "regex", "definition": pattern})
    for text in texts:
        expected = re.fullmatch(pattern, text, re.ASCII) is not None
        assert accepts(gbnf, as_json(text)) == expected, (pattern, text)


def test_text_format_is_any_json_string(accepts):
    gbnf = grammar({"type": "text"})
    assert accepts(gbnf, as_json(PATCH)) and accepts(gbnf, '"\\u0041\\/"')
    assert not accepts(gbnf, '"a\nb"')


def test_every_character_is_escaped_as_json_writes_it():
    for code in [*range(0x80), 0xE9, 0x2028, 0x1F600]:
        ch = chr(code)
        assert escaped(ch) == as_json(ch)[1:-1], hex(code)


@pytest.mark.parametrize(
    ("definition", "words"),
    [
        ("start: start 'x' | 'x'", "unexpected"),
        ('start: start "x" | "x"', "left-recursive"),
        ('start: a\na: b "x"\nb: a | "y"', "left-recursive"),
        ('start: "y"? start "x" | "x"', "left-recursive"),
        ('start: ("a"?)*', "can be empty"),
        ('start: "a" start', "matches no text"),
        (
            'start: ("a"~1000)~1000 ("b"~1000)~1000 ("c"~1000)~1000 ("d"~1000)~1000 ("e"~1000)~1000 "f"~1',
            "at most",
        ),
    ],
)
def test_what_llama_cpp_cannot_run_is_refused_naming_the_rule(definition, words):
    with pytest.raises(FormatError, match=words):
        check_format({"type": "grammar", "syntax": "lark", "definition": definition})


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "grammar", "syntax": "ebnf", "definition": "x"},
        {"type": "grammar", "syntax": "lark"},
        {"type": "grammar", "syntax": "regex", "definition": 3},
        {"type": "json"},
        "text",
    ],
)
def test_a_malformed_format_is_refused(fmt):
    with pytest.raises(FormatError):
        check_format(fmt)


def test_the_definition_and_the_grammar_are_bounded_while_built():
    with pytest.raises(FormatError, match=f"at most {MAX_SCHEMA_BYTES}"):
        check_format({"type": "grammar", "syntax": "regex", "definition": "a" * (MAX_SCHEMA_BYTES + 1)})
    # within the definition's bound, a grammar whose escaped text is over the grammar's:
    # a control character is one byte, and six characters escaped (seven in a GBNF literal)
    big = 'start: "' + chr(1) * (MAX_SCHEMA_BYTES - 10) + '"'
    assert len(big.encode()) <= MAX_SCHEMA_BYTES
    tracemalloc.start()
    with pytest.raises(FormatError, match=str(MAX_GRAMMAR_CHARS)):
        check_format({"type": "grammar", "syntax": "lark", "definition": big})
    assert tracemalloc.get_traced_memory()[1] < 20 * 2**20
    tracemalloc.stop()
    assert MAX_REPEATS >= 4000


def test_codex_grammar_compiles_small_and_fast():
    text = grammar(CODEX)
    assert len(text) < 4000, len(text)
