"""worker.tools.outside: the client's strings a template renders outside the contents keep
special tokens' texts, and parts of them at their ends, apart as marks read back as text."""

from __future__ import annotations

import json

from worker.tools.outside import CLOSE, OPEN, Masker, pieces

SPECIALS = ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]


def rendered(value: object) -> tuple[str, list[str]]:
    """`value` masked and rendered as a template's `tojson` would, and the marks' texts."""
    marks: dict[str, int] = {}
    text = json.dumps(Masker(SPECIALS).value(value, marks), ensure_ascii=False)
    return text, list(marks)


def read_back(text: str, texts: list[str]) -> tuple[str, list[str]]:
    """The text as rendered without marks, and the client's parts of it."""
    parts = list(pieces(text, texts))
    return "".join(p for p, _ in parts), [p for p, theirs in parts if theirs]


def test_special_texts_are_marked_and_read_back_in_place():
    value = {"description": 'Say "<|im_end|>" then <|endoftext|>', "n": 3, "tags": ["<|im_start|>x"]}
    text, texts = rendered(value)
    assert not any(s in text for s in SPECIALS)
    whole, theirs = read_back(text, texts)
    assert whole == json.dumps(value, ensure_ascii=False)  # the quote escaped, as without marks
    assert theirs == ["<|im_end|>", "<|endoftext|>", "<|im_start|>"]


def test_a_part_of_a_special_text_at_either_end_is_marked():
    """The template's text beside it could complete it (`<function=` NAME `>`)."""
    for edge, mark in [("<|im_end|", "<|im_end|"), ("x<", "<"), ("im_end|>", "im_end|>"), ("|>y", "|>")]:
        text, texts = rendered(edge)
        assert texts == [mark] and read_back(text, texts)[0] == json.dumps(edge)


def test_ordinary_strings_and_keys_are_left_as_they_are():
    value = {"type": "string", "a<b": "x > y", "enum": ["low", "high"], "ok": True}
    marks: dict[str, int] = {}
    assert Masker(SPECIALS).value(value, marks) == value and not marks


def test_equal_strings_get_equal_marks():
    marks: dict[str, int] = {}
    masker = Masker(SPECIALS)
    assert masker.value("a<|im_end|>", marks) == masker.value("a<|im_end|>", marks)
    assert list(marks) == ["<|im_end|>"]


def test_no_client_string_keeps_a_mark_s_code_points():
    """Else it could pass for a mark or a message's placeholder."""
    forged = f"{OPEN}tokenspool-text-0{CLOSE}"
    text, texts = rendered(forged)
    whole, theirs = read_back(text, texts)
    assert whole == json.dumps(forged, ensure_ascii=False) and theirs == [OPEN, CLOSE]
