"""worker/engine/steps/cost.py: the prompt tokens a step may add beside decoding streams: no limit
until their step alone is timed, then steered by each budgeted step's time against the stretch
(a running mean of the streams' step alone, at most x1.5 or x0.5 a step, between 1 and a million)."""

from __future__ import annotations

from worker.engine.steps.cost import StepCost


def timed(alone_s: float, decoding: int = 8, stretch: float = 2.0) -> StepCost:
    cost = StepCost(stretch=stretch, start=64)
    cost.add(decoding, alone_s, decoding=decoding)
    return cost


def test_there_is_no_limit_until_it_can_be_measured():
    cost = StepCost(stretch=2.0, start=64)
    assert cost.budget(8) is None  # no step of streams alone timed yet
    cost.add(100, 0.5)  # a step that only read a prompt: no stream decoded
    cost.add(40, 0.5, decoding=8, budgeted=True)  # a budgeted step with nothing to compare it to
    assert cost.budget(8) is None
    cost.add(8, 0.01, decoding=8)
    assert cost.budget(8) == 64  # the start, untouched by the steps before
    assert cost.budget(0) is None  # no stream decodes: nothing to keep short
    unstretched = timed(0.01, stretch=0.0)
    assert unstretched.budget(8) is None  # PREFILL_STRETCH=0


def test_a_quick_step_earns_more_rows_and_a_slow_one_fewer_in_proportion():
    cost = timed(0.25)  # target: twice 250 ms
    cost.add(72, 0.375, decoding=8, budgeted=True)  # 4/3 of the target's speed: 85.3 rows
    assert cost.budget(8) == 85
    cost.add(93, 0.625, decoding=8, budgeted=True)  # 4/5 of it: 68.3 rows
    assert cost.budget(8) == 68


def test_one_step_moves_the_allowance_at_most_half_again_or_by_half():
    fast = timed(0.01)
    fast.add(72, 0.001, decoding=8, budgeted=True)  # 20 times quicker than the target
    assert fast.budget(8) == 96
    slow = timed(0.01)
    slow.add(72, 1.0, decoding=8, budgeted=True)  # 50 times slower
    assert slow.budget(8) == 32


def test_the_allowance_stays_between_one_row_and_a_million():
    slow = timed(0.01)
    for _ in range(20):
        slow.add(9, 1.0, decoding=8, budgeted=True)
    assert slow.budget(8) == 1
    fast = timed(0.01)
    for _ in range(60):
        fast.add(9, 0.0001, decoding=8, budgeted=True)
    assert fast.budget(8) == 1_000_000


def test_the_streams_step_alone_is_a_running_mean_weighted_to_the_past():
    """10 ms, then 20 ms: a mean of 11 ms (not 15, nor the last 20), so a target of 22 ms."""
    cost = timed(0.01)
    cost.add(8, 0.02, decoding=8)
    cost.add(72, 0.022 / 1.2578125, decoding=8, budgeted=True)  # x1.2578125 of 64: 80.5
    assert cost.budget(8) == 80


def test_a_count_never_timed_alone_uses_the_nearest_one_timed_the_lower_on_a_tie():
    cost = StepCost(stretch=2.0, start=64)
    cost.add(4, 0.01, decoding=4)  # target 20 ms
    cost.add(8, 0.02, decoding=8)  # target 40 ms
    cost.add(30, 0.02, decoding=6, budgeted=True)  # 6 is as near 4 as 8: 4's, on target
    assert cost.budget(6) == 64
    cost.add(30, 0.02, decoding=7, budgeted=True)  # 8's: twice as quick as its target
    assert cost.budget(7) == 96
