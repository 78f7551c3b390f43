"""contract/freeform/terms.py: character sets as the freeform readers build them (sorted, merged,
never a surrogate), their complements, and the ASCII classes \\d, \\w and \\s."""

from __future__ import annotations

import re

import pytest

from contract.freeform.terms import (
    DIGIT,
    MAX_CODE,
    SPACE,
    WORD,
    Chars,
    chars,
    complement,
    one_of,
)


def members(c: Chars, upto: int = 0x3000) -> set[int]:
    return {x for lo, hi in c.ranges for x in range(lo, min(hi, upto) + 1)}


def test_a_set_is_sorted_and_overlapping_or_touching_ranges_are_merged():
    assert chars([(0x61, 0x7A), (0x30, 0x39), (0x35, 0x40), (0x41, 0x41)]) == Chars(
        ((0x30, 0x41), (0x61, 0x7A))
    )
    assert chars([(5, 5), (3, 3), (4, 4)]) == Chars(((3, 5),))
    assert chars([(1, 10), (2, 3)]) == Chars(((1, 10),))  # one inside another
    assert chars([(1, 2), (4, 5)]) == Chars(((1, 2), (4, 5)))  # a gap stays
    assert chars([]) == Chars(())


def test_a_set_never_holds_a_surrogate():
    assert chars([(0xD000, 0xE000)]) == Chars(((0xD000, 0xD7FF), (0xE000, 0xE000)))
    assert chars([(0xD800, 0xDFFF)]) == Chars(())
    assert chars([(0xD7FF, 0xD800), (0xDFFF, 0xE000)]) == Chars(((0xD7FF, 0xD7FF), (0xE000, 0xE000)))


def test_a_complement_holds_every_other_character_up_to_the_last_code_point():
    assert complement(one_of("b")) == Chars(((0, 0x61), (0x63, 0xD7FF), (0xE000, MAX_CODE)))
    assert complement([]) == Chars(((0, 0xD7FF), (0xE000, MAX_CODE)))
    assert complement([(0, MAX_CODE)]) == Chars(())
    assert complement([(0, 0x7F), (0x10000, MAX_CODE)]) == Chars(((0x80, 0xD7FF), (0xE000, 0xFFFF)))


def test_a_complement_of_a_complement_is_the_set_again():
    for ranges in ([(0x30, 0x39)], [(0, 0)], [(0x20, 0xD900)], one_of("a-z"), [(0xE000, MAX_CODE)]):
        assert complement(list(complement(ranges).ranges)) == chars(ranges)


def test_one_of_takes_each_character_of_a_text_as_is():
    assert one_of("a-c") == [(0x61, 0x61), (0x2D, 0x2D), (0x63, 0x63)]
    assert chars(one_of("cab")) == Chars(((0x61, 0x63),))
    assert one_of("") == []


@pytest.mark.parametrize(("cls", "pattern"), [(DIGIT, r"\d"), (WORD, r"\w"), (SPACE, r"\s")])
def test_the_classes_are_python_s_under_re_ascii(cls, pattern):
    python = re.compile(pattern, re.ASCII)
    expected = {x for x in range(0x3000) if python.fullmatch(chr(x))}
    assert members(chars(cls)) == expected
