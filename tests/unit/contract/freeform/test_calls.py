"""contract/freeform/calls.py: the input read back out of a call's arguments however they are
cut, escapes and surrogate pairs included; what streams adds up to what `done` says."""

from __future__ import annotations

import json
import random

import pytest

from contract.freeform.calls import InputReader, arguments_json

PATCH = '*** Begin Patch\n*** Add File: a "b"\\c.txt\n+tab\there é 😀 \x01\n*** End Patch\n'


def _cuts(text: str, rng: random.Random) -> list[str]:
    out, at = [], 0
    while at < len(text):
        n = rng.randint(1, 4)
        out.append(text[at : at + n])
        at += n
    return out


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize(
    "arguments",
    [
        arguments_json(PATCH),
        json.dumps({"input": PATCH}),  # ASCII-escaped: \u00e9 and \ud83d\ude00
        '{ "input" : ' + json.dumps(PATCH) + " }",
    ],
)
def test_the_input_streams_whole_however_the_arguments_are_cut(seed, arguments):
    reader = InputReader()
    streamed = "".join(reader.feed(part) for part in _cuts(arguments, random.Random(seed)))
    assert streamed == PATCH and reader.done() == PATCH


def test_a_lone_surrogate_is_a_replacement_character():
    reader = InputReader()
    assert reader.feed('{"input": "a\\ud83d"}') == "a\ufffd" and reader.done() == "a\ufffd"
    reader = InputReader()
    assert reader.feed('{"input": "a\\ud83dz\\ud83d\\n"}') == "a\ufffdz\ufffd\n"


def test_arguments_that_are_no_input_are_given_back_as_they_are():
    """Only an unconstrained call (a grammar llama.cpp gave up on) can be so."""
    reader = InputReader()
    assert reader.feed("plain text") == "" and reader.done() == "plain text"
