"""api/jobs/memory.py: when Redis counts as full (REDIS_MEMORY_HIGH of maxmemory), which of two
servers decides, the warning for a Redis without maxmemory, and a watch that outlives a
failed read. fakeredis has no INFO: each server here answers INFO memory with set figures."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import ConnectionError as RedisConnectionError

from api.jobs.memory import MemoryWatch
from contract.servers import Servers


class Reporting:
    """A server answering INFO memory with `used` and `maxmemory`, or raising `failing` first."""

    def __init__(self, used: int, maxmemory: int, failing: int = 0) -> None:
        self.used, self.maxmemory, self.failing = used, maxmemory, failing
        self.reads = 0

    async def info(self, section: str) -> dict:
        assert section == "memory"
        self.reads += 1
        if self.failing:
            self.failing -= 1
            raise RedisConnectionError("Redis is restarting")
        return {"used_memory": self.used, "maxmemory": self.maxmemory, "used_memory_human": "x"}


def watched(*servers: Reporting, high: float = 0.9) -> MemoryWatch:
    """A watch of one server, or of the queues and streams servers."""
    queues, streams = (servers[0], servers[0]) if len(servers) == 1 else servers
    watch = MemoryWatch(Servers(queues=queues, streams=streams), high)
    asyncio.run(watch.read())
    return watch


def test_redis_is_full_from_the_high_mark_of_its_maxmemory():
    assert watched(Reporting(90, 100), high=0.9).full
    assert watched(Reporting(100, 100), high=0.9).full
    assert not watched(Reporting(89, 100), high=0.9).full


def test_a_redis_without_maxmemory_is_never_full_and_is_warned_of_once(caplog):
    server = Reporting(10**12, 0)
    with caplog.at_level(logging.WARNING, logger="api.jobs.memory"):
        watch = watched(server)
        asyncio.run(watch.read())
    assert not watch.full and (watch.used, watch.maxmemory) == (10**12, 0)
    assert [r.getMessage() for r in caplog.records].count(
        "Redis has no maxmemory: it can run out of memory (see infra/redis.conf)"
    ) == 1


def test_of_two_servers_the_fullest_by_share_decides_not_by_bytes():
    queues, streams = Reporting(50, 100), Reporting(800, 10_000)
    watch = watched(queues, streams, high=0.5)
    assert (watch.used, watch.maxmemory, watch.full) == (50, 100, True)
    watch = watched(Reporting(10, 100), Reporting(9_500, 10_000), high=0.9)
    assert (watch.used, watch.maxmemory, watch.full) == (9_500, 10_000, True)


def test_a_server_without_maxmemory_leaves_the_decision_to_the_one_with_it(caplog):
    with caplog.at_level(logging.WARNING, logger="api.jobs.memory"):
        watch = watched(Reporting(10**9, 0), Reporting(95, 100), high=0.9)
    assert (watch.used, watch.maxmemory, watch.full) == (95, 100, True)
    assert any("no maxmemory" in r.getMessage() for r in caplog.records)


def test_one_server_behind_both_roles_is_read_once():
    server = Reporting(1, 100)
    watched(server)
    assert server.reads == 1


def test_nothing_read_yet_is_not_full():
    assert not MemoryWatch(Servers(queues=Reporting(99, 100), streams=Reporting(99, 100)), 0.9).full


def test_the_watch_reads_again_after_a_failed_read():
    server = Reporting(95, 100, failing=2)

    async def go() -> tuple[bool, int]:
        watch = MemoryWatch(Servers(queues=server, streams=server), 0.9, every_s=0.001)
        await watch.start()
        for _ in range(500):  # a few ms: two failed reads, then one that lands
            if watch.full:
                break
            await asyncio.sleep(0.001)
        await watch.stop()
        return watch.full, server.reads

    full, reads = asyncio.run(go())
    assert full and reads >= 3
