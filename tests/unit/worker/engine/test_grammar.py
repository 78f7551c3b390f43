"""worker/engine/grammar.py's TriggeredGate without a model: however the text is split into tokens,
the grammar is made at the first trigger and gets the tokens from the one holding its first
byte on; before that nothing is refused."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it
from worker.engine.grammar import TriggeredGate
from worker.errors import GrammarDeadEnd

TRIGGER = b"<tool_call>"


class RecordingGate:
    """Stands in for GrammarGate: records what it is given, refuses what it is told to."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.accepted: list[int] = []
        self.refuse = refuse or set()
        self.closed = False

    def allows(self, token: int) -> bool:
        return token not in self.refuse

    def accept(self, token: int) -> None:
        if token in self.refuse:
            raise GrammarDeadEnd(str(token))
        self.accepted.append(token)

    def close(self) -> None:
        self.closed = True


def split(text: bytes, rng: random.Random) -> list[bytes]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        pieces.append(text[i : i + n])
        i += n
    return pieces


def run(pieces: list[bytes]) -> list[RecordingGate]:
    """Feed the pieces as tokens 0, 1, ... through a TriggeredGate; the grammars it made."""
    made: list[RecordingGate] = []

    def make() -> RecordingGate:
        made.append(RecordingGate())
        return made[-1]

    g = TriggeredGate(make, TRIGGER, pieces.__getitem__)  # type: ignore[arg-type]
    for token in range(len(pieces)):
        assert g.allows(token)
        g.accept(token)
    return made


def test_the_replay_starts_at_the_token_holding_the_triggers_first_byte():
    rng = random.Random(7)
    for _ in range(500):
        before = bytes(rng.choice(b"ab <_>lo") for _ in range(rng.randint(0, 40))).replace(TRIGGER, b"")
        text = before + TRIGGER + b'\n{"name"'
        pieces = split(text, rng)
        made = run(pieces)
        at = text.find(TRIGGER)
        first = next(t for t in range(len(pieces)) if len(b"".join(pieces[: t + 1])) > at)
        assert len(made) == 1, (before, pieces)
        assert made[0].accepted == list(range(first, len(pieces))), (before, pieces)


def test_nothing_is_refused_before_the_trigger_and_text_that_cannot_follow_it_is_left_free():
    pieces = [b"hello ", b"<tool", b"_call>", b"oops", b" more"]
    gate = RecordingGate(refuse={1})  # the grammar cannot take the token holding the tag
    g = TriggeredGate(lambda: gate, TRIGGER, lambda t: pieces[t])  # type: ignore[arg-type]
    for token in range(len(pieces)):
        assert g.allows(token)
        g.accept(token)
    assert gate.closed and gate.accepted == []  # given up: the job goes on unconstrained
