"""contract/stats.py: the STATS hash's field names, and the counters a worker adds to it."""

from __future__ import annotations

from dataclasses import fields

from contract.stats import LEVELS, BatchCounters, StatField


def test_the_scheduler_s_and_the_job_threads_counters_add_up_field_by_field():
    scheduler = BatchCounters(steps=3, sequences=9, decode_us=500)
    threads = BatchCounters(tokens=12, token_us=40, publishes=2)
    both = BatchCounters(steps=3, sequences=9, decode_us=500, tokens=12, token_us=40, publishes=2)
    assert scheduler.plus(threads) == both
    assert scheduler.steps == 3 and threads.steps == 0  # neither is changed


def test_each_field_names_its_model_and_the_levels_are_counters_too():
    names = {f.name for f in fields(BatchCounters)}
    assert set(LEVELS) <= names
    assert StatField.batch("steps", "m") == "batch:steps:m" and StatField.tokens("m") == "tokens:m"
    assert len({StatField.routed("m"), StatField.route_fallbacks("m"), StatField.requeued("crash")}) == 3
