"""Turns between proofs of suspects and the continuations they hold up."""

from __future__ import annotations

from worker.attempts.proofs import ProofTurns


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_new_worker_starts_a_proof_at_once_even_beside_continuations():
    """Its suspects have waited already; nothing of its own has been held up yet."""
    assert ProofTurns(Clock()).may_start(reading_again=20)


def test_no_second_group_while_one_proves():
    clock = Clock()
    turns = ProofTurns(clock)
    turns.began()
    clock.now += 1
    turns.began()  # another suspect of the same group
    assert not turns.may_start(reading_again=0)
    turns.ended()
    assert turns.may_start(reading_again=0)


def test_after_a_proof_the_continuations_read_again_get_as_long_as_it_took():
    """A crash storm: a worker that started no proof while a continuation was read left
    suspects 75 s in the suspect queue; one that started the next proof as the last ended
    held its continuations 25 s behind them."""
    clock = Clock()
    turns = ProofTurns(clock)
    turns.began()
    clock.now += 4.0
    turns.ended()
    assert turns.may_start(reading_again=0)  # nothing held up: the next group at once
    clock.now += 3.9
    assert not turns.may_start(reading_again=3)
    clock.now += 0.1
    assert turns.may_start(reading_again=3)  # their turn is over: the suspects' again


def test_an_end_without_a_start_changes_nothing():
    clock = Clock()
    turns = ProofTurns(clock)
    clock.now += 10
    turns.ended()
    assert turns.may_start(reading_again=5)
