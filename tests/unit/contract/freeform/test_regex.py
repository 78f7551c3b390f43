"""contract/freeform/regex.py: what a pattern reads as, and every construct outside the
subset (one dialect would read it otherwise, or no grammar can hold it) refused by name.
(That a pattern's grammar takes exactly what Python's `re` matches is test_escaped.py's.)"""

from __future__ import annotations

import pytest

from contract.freeform.regex import parse_regex
from contract.freeform.terms import Alt, Chars, FormatError, Repeat, Seq, Text


def test_a_pattern_reads_as_its_terms():
    assert parse_regex("ab+") == Seq((Text("a"), Repeat(Text("b"), 1, None)))
    assert parse_regex("^(?:x|yz){2,5}?$") == Repeat(Alt((Text("x"), Text("yz"))), 2, 5)
    assert parse_regex("[a-c\\d_]") == Chars(((0x30, 0x39), (0x5F, 0x5F), (0x61, 0x63)))
    assert parse_regex("(?P<name>q)") == Text("q")
    assert parse_regex("\\$\\.") == Text("$.")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("a(?=b)", "lookarounds"),
        ("(?<!a)b", "lookarounds"),
        ("(?i)a", "inline flags"),
        ("(a)\\1", "backreferences"),
        ("\\p{L}", "Unicode properties"),
        ("\\bword\\b", "word boundaries"),
        ("a++", "possessive"),
        ("a**", "repetition of a repetition"),
        ("*a", "nothing to repeat"),
        ("a{1001}", "above 1000"),
        ("a{5,2}", "below its minimum"),
        ("a{x}", "not a count"),
        ("a^b", "anchor"),
        ("[[:alpha:]]", "'[' inside a class"),
        ("[a&&b]", "set operation"),
        ("[z-a]", "class range"),
        ("(ab", "without its ')'"),
        ("ab)", "unmatched ')'"),
        ("[ab", "without its ']'"),
        ("\\q", "unknown escape"),
        ("\\012", "octal"),
        ("\\ud800", "surrogate"),
        ("\\xZZ", "malformed"),
        ("(" * 40 + "a" + ")" * 40, "nested deeper"),
    ],
)
def test_what_is_outside_the_subset_is_refused_saying_what(pattern, words):
    with pytest.raises(FormatError) as info:
        parse_regex(pattern)
    assert words in str(info.value), str(info.value)
