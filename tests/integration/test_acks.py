"""api/acks.py on real servers: a new job is confirmed once a replica holds it, not while the
replica is held behind (a paused relay on its link), never when its key is missing, and at
once on a server without replicas."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aredis

from api.acks import ReplicaAcks
from devstack.processes import start_redis
from devstack.relay import Relay

pytestmark = pytest.mark.integration


def test_a_job_is_confirmed_once_a_replica_has_it(tmp_path):
    primary, url = start_redis(tmp_path)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    link = Relay(port)
    replica, replica_url = start_redis(tmp_path, extra=("--replicaof", "127.0.0.1", str(link.port)))
    try:
        with redis.Redis.from_url(replica_url) as r:
            deadline = time.monotonic() + 30
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline
                time.sleep(0.1)

        async def go() -> tuple[bool, bool, bool, float]:
            client = aredis.Redis.from_url(url)
            acks = ReplicaAcks(client, timeout_s=0.5)
            await client.set("job", "1")
            there = await acks.settled("job")
            missing = await acks.settled("no-such-job")
            link.pause()
            await client.set("job2", "1")
            started = time.monotonic()
            held = await acks.settled("job2")
            took = time.monotonic() - started
            await client.aclose()
            return there, missing, held, took

        there, missing, held, took = asyncio.run(go())
        assert there and not missing
        assert not held and took >= 0.45  # WAIT gave up after its timeout: not confirmed
    finally:
        link.close()
        for p in (replica, primary):
            p.stop()


def test_a_server_without_replicas_confirms_at_once(tmp_path):
    server, url = start_redis(tmp_path)
    try:

        async def go() -> tuple[bool, float]:
            client = aredis.Redis.from_url(url)
            started = time.monotonic()
            ok = await ReplicaAcks(client, timeout_s=5).settled()
            await client.aclose()
            return ok, time.monotonic() - started

        ok, took = asyncio.run(go())
        assert ok and took < 1
    finally:
        server.stop()
