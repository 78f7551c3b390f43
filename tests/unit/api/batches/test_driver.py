"""api/batches/driver.py on fakeredis: a drive that Redis refuses is a failure of the batch,
counted and logged; only a Redis that is away is nobody's fault.

Found by CI: FINALIZE called HLEN, which the API's ACL user may not run. Redis answered
NOPERM at every tick, the driver took that for Redis being away (logged at debug), and the
batch stayed `in_progress` with nothing in the log to say why."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError

from api.batches.driver import BatchDriver
from contract import keys

BATCH = "batch_abc"


def driver(error: Exception) -> tuple[BatchDriver, fakeredis.FakeAsyncRedis]:
    r = fakeredis.FakeAsyncRedis()
    services = SimpleNamespace(
        redis=r, settings=SimpleNamespace(batches=SimpleNamespace(batch_interval_s=1.0))
    )
    made = BatchDriver(services)  # type: ignore[arg-type]

    async def drive(batch_id: str) -> dict:
        raise error

    made.drive = drive  # type: ignore[method-assign]
    return made, r


def test_a_refused_drive_is_counted_against_the_batch_and_logged(caplog):
    made, r = driver(NoPermissionError("this user has no permissions to run the 'hlen' command"))
    with caplog.at_level(logging.ERROR, logger="api.batches.driver"):
        asyncio.run(made.drive_guarded(BATCH))
    assert asyncio.run(r.hget(keys.batch(BATCH), "failures")) == b"1"
    assert any("drive failed" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize("error", [RedisConnectionError("reset"), OSError("unreachable")])
def test_a_redis_that_is_away_counts_against_no_batch(error):
    made, r = driver(error)
    asyncio.run(made.drive_guarded(BATCH))
    assert asyncio.run(r.hget(keys.batch(BATCH), "failures")) is None
