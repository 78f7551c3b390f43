"""worker/engine/steps/picks.py: a pick is a plain value: a bare token by default, compared and hashed
by what it holds, and not changed once made (the sender and the budget pass it on as it came)."""

from __future__ import annotations

import dataclasses

import pytest

from worker.engine.steps.picks import Pick


def test_a_bare_pick_has_no_logprob_and_no_alternatives():
    pick = Pick(42)
    assert (pick.token, pick.logprob, pick.top) == (42, None, ())


def test_picks_are_equal_by_what_they_hold():
    assert Pick(7, -0.5, ((7, -0.5), (9, -1.0))) == Pick(7, -0.5, ((7, -0.5), (9, -1.0)))
    assert Pick(7, -0.5) != Pick(7, -0.25)
    assert Pick(7) != Pick(8)
    assert Pick(7, -0.5, ((7, -0.5),)) != Pick(7, -0.5)
    assert len({Pick(3, -1.0), Pick(3, -1.0), Pick(4)}) == 2


def test_a_pick_cannot_be_changed_once_made():
    pick = Pick(7, -0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pick.token = 8  # type: ignore[misc]
    assert pick == Pick(7, -0.5)
