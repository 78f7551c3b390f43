"""api/pool_settings.py: the Batch API's, routing's, job lifetimes' and Redis clients' settings,
read from the environment into their groups of `Settings`, with their defaults and their
floors."""

from __future__ import annotations

import dataclasses

import pytest

from api.pool_settings import Batches, Connection, Lifetimes, Routing
from api.settings import Settings
from contract.settings import SettingError, rows


def test_the_defaults_without_any_variable():
    s = Settings.from_env({})
    assert (s.batches.file_max_bytes, s.batches.file_retention_s, s.batches.batch_in_flight) == (
        20_000_000,
        7 * 86400,
        32,
    )
    assert (s.routing.enabled, s.routing.wait_s, s.routing.min_chars, s.routing.per_key) == (
        True,
        1.0,
        500,
        8,
    )
    assert (s.lifetimes.queue_wait_s, s.lifetimes.job_deadline_s, s.lifetimes.reaper_settle_s) == (
        600.0,
        0.0,
        5.0,
    )
    assert (s.connection.redis_pool, s.connection.redis_pool_wait_s, s.connection.replica_ack_s) == (
        50,
        30.0,
        1.0,
    )


def test_each_variable_lands_in_its_own_group_with_its_type():
    s = Settings.from_env(
        {
            "FILE_MAX_BYTES": "1024",
            "BATCH_INTERVAL_SECONDS": "0.25",
            "PREFIX_ROUTING": "0",
            "ROUTE_BALANCE_REL": "2",
            "JOB_DEADLINE_SECONDS": "90",
            "WORKER_STALE_SECONDS": "7.5",
            "REDIS_POOL_SIZE": "8",
            "REDIS_TIMEOUT_SECONDS": " 2 ",
        }
    )
    assert s.batches == Batches(file_max_bytes=1024, batch_interval_s=0.25)
    assert s.routing == Routing(enabled=False, balance_rel=2.0)
    assert s.lifetimes == Lifetimes(job_deadline_s=90.0, worker_stale_s=7.5)
    assert s.connection == Connection(redis_pool=8, redis_timeout_s=2.0)
    assert isinstance(s.routing.balance_rel, float) and isinstance(s.batches.file_max_bytes, int)


@pytest.mark.parametrize(
    ("name", "lowest", "below"),
    [
        ("FILE_RETENTION_SECONDS", "3600", "3599"),
        ("BATCH_IN_FLIGHT", "1", "0"),
        ("ROUTE_WAIT_SECONDS", "0.05", "0.01"),
        ("ROUTE_MIN_CHARS", "1", "0"),
        ("ROUTE_BALANCE_ABS", "0", "-1"),
        ("ROUTE_BALANCE_REL", "1", "0.9"),
        ("ROUTED_JOBS_PER_KEY", "0", "-1"),
        ("REDIS_POOL_SIZE", "1", "0"),
        ("REPLICA_ACK_SECONDS", "0", "-0.5"),
    ],
)
def test_a_value_below_its_floor_stops_the_start_naming_the_variable(name, lowest, below):
    Settings.from_env({name: lowest})  # the floor itself is taken
    with pytest.raises(SettingError, match=f"{name} must be at least") as refused:
        Settings.from_env({name: below})
    assert repr(below) in str(refused.value)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FILE_MAX_BYTES", "20MB"),
        ("BATCH_MAX_LINES", "1.5"),
        ("PREFIX_ROUTING", "maybe"),
        ("QUEUE_WAIT_SECONDS", "ten"),
        ("REDIS_POOL_SIZE", ""),
    ],
)
def test_a_value_that_is_not_of_its_type_stops_the_start_naming_the_variable(name, raw):
    with pytest.raises(SettingError, match=name):
        Settings.from_env({name: raw})


def test_routing_is_on_unless_turned_off():
    for raw, enabled in (("1", True), ("yes", True), ("on", True), ("0", False), ("off", False), ("", False)):
        assert Settings.from_env({"PREFIX_ROUTING": raw}).routing.enabled is enabled, raw


def test_the_groups_are_fixed_once_read():
    s = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.routing.per_key = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.connection.redis_pool = 1  # type: ignore[misc]


def test_the_documentation_shows_each_default_as_the_operator_writes_it():
    shown = {r.env: r.default for g in (Batches, Routing, Lifetimes, Connection) for r in rows(g)}
    assert shown["JOB_DEADLINE_SECONDS"] == "`0` (none)"
    assert shown["QUEUE_WAIT_SECONDS"] == "`600`"  # a whole float without its ".0"
    assert shown["ROUTE_WAIT_SECONDS"] == "`1`" and shown["ROUTE_BALANCE_REL"] == "`1.5`"
    assert shown["PREFIX_ROUTING"] == "1"
    assert shown["FILE_RETENTION_SECONDS"] == "`604800`"
    assert len(shown) == 5 + 6 + 8 + 4  # every field of each group, each under its own variable
