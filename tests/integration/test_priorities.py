"""Service tiers through real processes: with the only worker busy, waiting jobs start in tier
order (`priority`, then `default`, then `flex`), whatever the order they came in."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from contract import entries, keys
from contract.entries import Started
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from tests.hold import holding
from tests.integration.conftest import MODEL
from tests.integration.test_recovery import LONG

pytestmark = pytest.mark.integration


def _first_start_ms(r: redis.Redis, job_id: str) -> int:
    for eid, fields in r.xrange(keys.events(job_id)):
        if isinstance(entries.decode(fields), Started):
            return int(eid.split(b"-")[0])
    raise AssertionError(f"{job_id} never started")


def test_waiting_jobs_start_in_tier_order(tmp_path):
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url)
    worker = start_worker(tmp_path, url, env={"SLOTS": "1"})
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        r = redis.Redis.from_url(url)

        def background(**kw) -> str:
            body = {"model": MODEL, "messages": [LONG], "max_tokens": 2, "background": True, **kw}
            answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
            assert answer.status_code == 202, answer.text
            return answer.json()["id"]

        tiers = ["flex", "default", None, "priority", "auto", "flex"]
        with holding(base, MODEL) as busy:  # the only slot, until every waiting job is queued
            while r.hget(keys.job(busy), keys.JobField.STATUS) != b"running":
                time.sleep(0.01)
            waiting = [background(**({"service_tier": t} if t else {})) for t in tiers]
        deadline = time.monotonic() + 120
        while not all(r.hget(keys.job(c), keys.JobField.ENDED) == b"1" for c in waiting):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        order = sorted(range(len(tiers)), key=lambda n: _first_start_ms(r, waiting[n]))
        rank = {"priority": 0, "default": 1, None: 1, "auto": 1, "flex": 2}
        assert [rank[tiers[n]] for n in order] == sorted(rank[t] for t in tiers)
        assert order == [3, 1, 2, 4, 0, 5]  # first in, first out within a tier
        bad = httpx.post(
            base + "/v1/chat/completions",
            json={"model": MODEL, "messages": [LONG], "service_tier": "scale"},
            timeout=10,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "service_tier"
    finally:
        for p in (worker, api, redis_proc):
            p.stop()
