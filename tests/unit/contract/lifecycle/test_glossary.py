"""contract/lifecycle/glossary.py: each word is one sentence, still used in the code, and
explained further in the file it names; the words a newcomer meets first are all there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract.lifecycle.glossary import WORDS

ROOT = Path(__file__).resolve().parents[4]
CODE = "\n".join(p.read_text() for top in ("api", "worker", "contract") for p in (ROOT / top).rglob("*.py"))


def used(word: str, text: str) -> bool:
    """`word` in `text` as a word or its inflection (`preempted`), its spaces matching '_' or
    '-' too (`_hand_off`), in a name too (`RETENTION_SECONDS`)."""
    stem = r"[ _-]".join(map(re.escape, word.split()))
    pattern = rf"(?<![a-z]){stem}(?:s|es|d|ed|ing|ion|ions)?(?![a-z])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def test_the_words_the_code_coins_most_are_all_there_once():
    words = [w.word for w in WORDS]
    assert len(set(words)) == len(words)
    assert {"owner", "held", "suspect", "settle", "lend", "continuation", "proof", "ticket"} <= set(words)


@pytest.mark.parametrize("word", WORDS, ids=lambda w: w.word)
def test_each_word_is_one_sentence_used_in_the_code_and_in_the_file_it_names(word):
    assert word.meaning[0].isupper() and word.meaning.endswith(".")
    assert not re.search(r"[.;] +[A-Za-z]", word.meaning[:-1]), "one sentence, no semicolons"
    assert used(word.word, CODE.replace(".py", " ")), f"{word.word!r} is used nowhere in the code"
    assert used(word.word, (ROOT / word.see).read_text()), f"{word.see} does not say {word.word!r}"


def test_a_word_used_only_in_another_sense_is_not_found():
    assert used("hand off", "def _hand_off(self):") and used("stall", "STALLS = 1")
    assert not used("hand off", "handoffs") and not used("lend", "blender")
