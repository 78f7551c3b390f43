"""api/batches/routes.py's status changes on fakeredis: a cancel and the driver, racing on any
replicas, never undo each other's change (issue 38, item 9)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import fakeredis
from starlette.requests import Request

from api.batches import routes as batches
from api.http.errors import APIError
from contract import keys

BATCH = "batch_race"
HASH = {
    "owner": "",
    "endpoint": "/v1/chat/completions",
    "input_file_id": "file-x",
    "created_at": "1",
    "expires_at": "2",
    "total": "1",
    "next": "1",
}


def cancel_after_reading(status_read: str, status_now: str) -> tuple[int | str, str]:
    """Cancel a batch whose hash says `status_read` when the handler reads it, and
    `status_now` by the time it writes (the driver ended it in between)."""
    r = fakeredis.FakeAsyncRedis()
    services = SimpleNamespace(redis=r)
    read = batches.batch_hash

    async def go() -> tuple[int | str, str]:
        await r.hset(keys.batch(BATCH), mapping={**HASH, "status": status_now})
        calls = 0

        async def stale_first(s, batch_id):  # the handler's first read is from before the end
            nonlocal calls
            calls += 1
            h = await read(s, batch_id)
            return {**h, "status": status_read} if calls == 1 else h

        batches.batch_hash = stale_first
        scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}
        scope["state"] = {"services": services}
        scope["path_params"] = {"batch_id": BATCH}
        try:
            answer = await batches.cancel(Request(scope))
            outcome: int | str = answer.status_code
        except APIError as exc:
            outcome = exc.status
        finally:
            batches.batch_hash = read
        return outcome, (await r.hget(keys.batch(BATCH), "status")).decode()

    return asyncio.run(go())


def test_a_cancel_that_read_a_running_batch_never_reopens_one_that_has_since_completed():
    assert cancel_after_reading("in_progress", "completed") == (400, "completed")


def test_a_cancel_of_a_running_batch_takes():
    assert cancel_after_reading("in_progress", "in_progress") == (200, "cancelling")
