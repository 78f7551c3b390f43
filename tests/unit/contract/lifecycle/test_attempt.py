"""contract/lifecycle/attempt.py: `after` moves an attempt exactly as its table says, and
refuses every other move."""

from __future__ import annotations

import pytest

from contract.lifecycle.attempt import ATTEMPT_MOVES, ATTEMPT_STATES, IllegalMove, after

NAMES = [s.name for s in ATTEMPT_STATES]


@pytest.mark.parametrize("move", ATTEMPT_MOVES, ids=lambda m: m.name)
def test_each_move_goes_where_its_row_says_stays_where_it_keeps_and_is_refused_elsewhere(move):
    for state in NAMES:
        if state in move.keeps:
            assert after(state, move.name) == state
        elif state in move.sources:
            assert [after(state, move.name, t) for t in move.targets] == list(move.targets)
        else:
            with pytest.raises(IllegalMove):
                after(state, move.name, move.targets[0])


def test_a_claim_makes_a_new_attempt_and_nothing_else_does():
    assert after("", "claim") == "claimed"
    with pytest.raises(IllegalMove):
        after("", "start", "running")


def test_a_move_with_two_targets_must_be_told_which_and_an_unknown_move_is_refused():
    with pytest.raises(IllegalMove, match="start to ''"):
        after("claimed", "start")
    with pytest.raises(IllegalMove, match="start to 'ended'"):
        after("claimed", "start", "ended")
    with pytest.raises(IllegalMove, match="no move 'resume'"):
        after("running", "resume")


def test_a_fenced_attempt_stays_fenced_whatever_its_threads_do_next():
    made = {m.name for m in ATTEMPT_MOVES if "fenced" in m.keeps}
    assert made == {"start", "cancel", "preempt", "clear", "end", "fence", "hand off"}
    assert all(after("fenced", name) == "fenced" for name in made)
