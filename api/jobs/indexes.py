"""Every shard's `running` and `pending` index (contract/keys.py), read in one go. The
reaper looks at them each tick. /metrics counts them as in flight."""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis

from contract.entries import as_text
from contract.lua import jobs
from contract.servers import is_cluster


class ShardIndexes:
    """Every shard's `running` and `pending` index, read with the INDEXES script. On one
    server that is one round trip. On a cluster it is one call per shard, all at once. The
    reaper reads them twice a second, whether or not anything runs. It used to send two
    pipelines of a command per shard: 64 commands packed in Python every tick."""

    def __init__(self, streams: aredis.Redis) -> None:
        self._script = streams.register_script(jobs.INDEXES)
        self._groups = jobs.index_keys(is_cluster(streams))

    async def read(
        self, pending_before_ms: int | None = None, count: int = 64
    ) -> tuple[list[str], list[str]]:
        """The running ids. With `pending_before_ms`, also up to `count` ids of each shard
        pending since before that time."""
        args = ["" if pending_before_ms is None else pending_before_ms, count]
        replies = await asyncio.gather(*(self._script(keys=group, args=args) for group in self._groups))
        running = [as_text(i) for reply in replies for i in reply[0]]
        pending = [as_text(i) for reply in replies for i in reply[1]]
        return running, pending
