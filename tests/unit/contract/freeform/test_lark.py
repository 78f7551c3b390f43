"""contract/freeform/lark.py: Codex's apply_patch grammar read rule by rule, and every Lark
feature outside the subset refused with a message saying what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.freeform.lark import parse_lark
from contract.freeform.terms import Alt, Chars, FormatError, Ref, Repeat, Seq, Text

APPLY_PATCH = (Path(__file__).parent / "apply_patch.lark").read_text()
NOT_NEWLINE = Chars(((0, 9), (11, 0xD7FF), (0xE000, 0x10FFFF)))


def test_codex_apply_patch_grammar_reads_as_its_rules():
    defs = parse_lark(APPLY_PATCH)
    assert defs["start"] == Seq((Ref("begin_patch"), Repeat(Ref("hunk"), 1, None), Ref("end_patch")))
    assert defs["end_patch"] == Seq((Text("*** End Patch"), Repeat(Ref("LF"), 0, 1)))
    assert defs["hunk"] == Alt((Ref("add_hunk"), Ref("delete_hunk"), Ref("update_hunk")))
    assert defs["filename"] == Repeat(NOT_NEWLINE, 1, None)
    assert defs["add_line"] == Seq(
        (Text("+"), Repeat(NOT_NEWLINE, 0, None), Ref("LF"))
    )  # `-> line` shapes the tree only
    assert defs["change_context"] == Seq(
        (Alt((Text("@@"), Seq((Text("@@ "), Repeat(NOT_NEWLINE, 1, None))))), Ref("LF"))
    )
    assert defs["LF"] == Text("\n")  # %import common.LF


def test_lark_forms_beside_codex_s():
    defs = parse_lark(
        """
        // a comment
        ?start: greeting ("," NAME)* [END]   # another
              | "x" ~ 2..3
        !greeting.2: "hi" | "hello" -> hi
        NAME: "a".."z"+
        END: "\\n" | "\\x21" "\\u00e9"
        %import common (DIGIT, WS)
        %import common.INT -> NUMBER
        """
    )
    assert defs["start"] == Alt(
        (
            Seq((Ref("greeting"), Repeat(Seq((Text(","), Ref("NAME"))), 0, None), Repeat(Ref("END"), 0, 1))),
            Repeat(Text("x"), 2, 3),
        )
    )
    assert defs["NAME"] == Repeat(Chars(((97, 122),)), 1, None)
    assert defs["END"] == Alt((Text("\n"), Seq((Text("!"), Text("é")))))
    assert defs["NUMBER"] == Repeat(Ref("common__DIGIT"), 1, None) and "DIGIT" in defs and "WS" in defs


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        ('start: "a"\n%ignore " "', "'%ignore': not supported (it would allow text between any two"),
        ('start: "a"\n%declare X', "'%declare': not supported"),
        ('start: "a"\n%import foo.X', "only Lark's 'common'"),
        ('start: "a"\n%import common.ESCAPED_STRING', "common.ESCAPED_STRING"),
        ('start: "a"i', "string flags ('i')"),
        ("start: /a/s", "regular expression flags ('s')"),
        ("start: /a(?=b)/", "lookarounds"),
        ("start: /(a)\\1/", "backreferences"),
        ("start: /^a/", "anchor"),
        ('start: item\nitem{x}: "a"', "template"),
        ('a: "x"', "no 'start' rule"),
        ("start: b", "does not define"),
        ('start: X\nX: x\nx: "a"', "terminal 'X' refers to the rule 'x'"),
        ('start: "a"\nstart: "b"', "defined twice"),
        ('start: "a" ~ 1001', "above 1000"),
        ('start: "ab".."z"', "range"),
        ('start: ""', "empty string"),
        ('start: "a" @', "unexpected '@'"),
        ('start: ("a"', "')'"),
        ("start: " + "(" * 40 + '"a"' + ")" * 40, "nested deeper"),
    ],
)
def test_what_is_outside_the_subset_is_refused_saying_what(grammar, words):
    with pytest.raises(FormatError) as info:
        parse_lark(grammar)
    assert words in str(info.value), str(info.value)
