"""worker/text/json_scan.py: the streaming JSON scanner: where each value starts and ends by its
path, the decoded text of strings, the raw text of a captured value, the same however the text
is cut, and the JSON it refuses."""

from __future__ import annotations

import random
import re

import pytest

from worker.text.json_scan import JsonScanner, ScanError


class Recorder:
    """What the scanner told its handler, a string's characters merged into one text event."""

    def __init__(self, capture: tuple | None = None) -> None:
        self.events: list[tuple] = []
        self.raw: dict[tuple, str] = {}
        self._capture = capture
        self.scanner = JsonScanner(self)

    def started(self, path: tuple, kind: str) -> None:
        self.events.append(("start", path, kind))
        if path == self._capture:
            self.scanner.capture(path)

    def text(self, path: tuple, ch: str) -> None:
        if self.events and self.events[-1][:2] == ("text", path):
            self.events[-1] = ("text", path, self.events[-1][2] + ch)
        else:
            self.events.append(("text", path, ch))

    def ended(self, path: tuple) -> None:
        self.events.append(("end", path))
        if path == self._capture:
            self.raw[path] = self.scanner.take_raw()


def scan(text: str, pieces: list[str] | None = None, capture: tuple | None = None) -> Recorder:
    rec = Recorder(capture)
    for piece in pieces if pieces is not None else [text]:
        rec.scanner.feed(piece)
    rec.scanner.finish()
    return rec


def cut(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 5)
        out.append(text[i : i + n])
        i += n
    return out


DOC = '{"a": [1, "x"], "b": {}, "c": [], "d": {"e": -2.5e3}}'
DOC_EVENTS = [
    ("start", (), "obj"),
    ("start", ("a",), "arr"),
    ("start", ("a", 0), "scalar"),
    ("end", ("a", 0)),
    ("start", ("a", 1), "str"),
    ("text", ("a", 1), "x"),
    ("end", ("a", 1)),
    ("end", ("a",)),
    ("start", ("b",), "obj"),
    ("end", ("b",)),
    ("start", ("c",), "arr"),
    ("end", ("c",)),
    ("start", ("d",), "obj"),
    ("start", ("d", "e"), "scalar"),
    ("end", ("d", "e")),
    ("end", ("d",)),
    ("end", ()),
]


def test_each_value_is_reported_by_its_path_as_it_starts_and_ends():
    rec = scan(DOC)
    assert rec.events == DOC_EVENTS
    assert rec.scanner.done


@pytest.mark.parametrize("seed", range(5))
def test_the_events_are_the_same_however_the_text_is_cut(seed):
    assert scan(DOC, cut(DOC, seed)).events == DOC_EVENTS
    assert scan(DOC, list(DOC)).events == DOC_EVENTS


def test_strings_are_reported_decoded_and_keys_only_in_paths():
    text = r'{"k\"ey": "a\nb\t\"q\" \\ \/ d\u00e9j\u00e0 \ud83d\ude00"}'
    rec = scan(text, list(text))
    assert rec.events == [
        ("start", (), "obj"),
        ("start", ('k"ey',), "str"),
        ("text", ('k"ey',), 'a\nb\t"q" \\ / déjà 😀'),
        ("end", ('k"ey',)),
        ("end", ()),
    ]


@pytest.mark.parametrize("seed", range(3))
def test_a_captured_value_is_its_raw_text_exactly_as_written(seed):
    text = '{"name": "f", "arguments": { "city": "O\\"slo", "n": [1, 2.0], "k": 7 } , "z": 1}'
    rec = scan(text, cut(text, seed), capture=("arguments",))
    assert rec.raw == {("arguments",): '{ "city": "O\\"slo", "n": [1, 2.0], "k": 7 }'}


@pytest.mark.parametrize(
    ("text", "raw"),
    [('{"x": 12, "y": 3}', "12"), ('{"x": 12}', "12"), ('{"x": "s p"}', '"s p"'), ('{"x": []}', "[]")],
)
def test_a_captured_number_ends_before_its_delimiter(text, raw):
    assert scan(text, capture=("x",)).raw == {("x",): raw}


def test_a_number_at_the_root_ends_only_when_the_text_does():
    rec = Recorder()
    rec.scanner.feed("42")
    assert rec.events == [("start", (), "scalar")] and not rec.scanner.done  # 420 may follow
    rec.scanner.finish()
    assert rec.events[-1] == ("end", ()) and rec.scanner.done
    assert scan("true  \n").scanner.done


def test_nested_empty_containers_and_indices_in_paths():
    rec = scan('[[], {}, [["z"]]]')
    starts = [(e[1], e[2]) for e in rec.events if e[0] == "start"]
    assert starts == [
        ((), "arr"),
        ((0,), "arr"),
        ((1,), "obj"),
        ((2,), "arr"),
        ((2, 0), "arr"),
        ((2, 0, 0), "str"),
    ]
    assert ("text", (2, 0, 0), "z") in rec.events and rec.scanner.done


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{} x", "text after the JSON value: 'x'"),
        ("[1 2]", "expected ',' or ']', got '2'"),
        ('{"a" 1}', "unexpected '1' in an object"),
        ('{"a": 1,}', "unexpected '}' in an object"),
        ("[1,]", "unexpected ']' where a value belongs"),
        ('{"a": }', "unexpected '}' where a value belongs"),
        ('{"a": tru}', "not a JSON value: 'tru'"),
        ("[01]", "not a JSON value: '01'"),
        ('["a\nb"]', "a raw control character in a string"),
        ('["\\x"]', "a bad escape \\x"),
        ('["\\u12g4"]', "a bad \\u escape"),
        ("{'a': 1}", 'unexpected "\'" in an object'),
    ],
    ids=[
        "after-root",
        "no-comma",
        "no-colon",
        "trailing-comma-object",
        "trailing-comma-array",
        "missing-value",
        "bad-literal",
        "leading-zero",
        "raw-newline",
        "bad-escape",
        "bad-unicode",
        "single-quotes",
    ],
)
def test_text_that_is_not_json_is_refused(text, said):
    with pytest.raises(ScanError, match=re.escape(said)):
        scan(text)
