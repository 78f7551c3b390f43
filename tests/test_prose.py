"""devstack/prose.py's measures, on small texts whose figures are known."""

from __future__ import annotations

from devstack.prose import docstrings, sentence_words, trailing_comments

SOURCE = '''"""A module. It says why."""

x = 1  # a trailing comment
# a comment on its own line


def f():
    """One sentence of six words here."""
    return x  # another
'''


def test_sentences_are_counted_in_words():
    assert sentence_words("A module. It says why.") == [2, 3]
    assert sentence_words("Wrapped\n    over lines: still one (sentence).") == [6]
    assert [sentence_words(d) for d in docstrings(SOURCE)] == [[2, 3], [6]]


def test_a_list_item_a_paragraph_and_a_closing_parenthesis_end_a_sentence():
    doc = "Two kinds:\n- the first one\n- the second\n\nthen a paragraph (it ends.) Next one."
    assert sentence_words(doc) == [2, 3, 2, 5, 2]
    assert sentence_words("Steps:\n1. read it\n2. write it") == [1, 2, 2]


def test_only_comments_after_code_on_their_line_trail():
    lines, trailing = trailing_comments(SOURCE)
    assert (lines, trailing) == (5, 2)  # two docstrings, x = 1, def f, return x; two trail
