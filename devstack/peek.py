"""Looking into a running stack's Redis from outside, as tests and benchmarks do (the API and
workers have their own, shard by shard, in api/jobs/store.py and contract/queueing.py)."""

from __future__ import annotations

import redis

from contract import keys


def running_ids(streams: redis.Redis) -> list[str]:
    """The job ids in every shard's running index (contract.keys.running)."""
    with streams.pipeline(transaction=False) as pipe:
        for shard in range(keys.SHARDS):
            pipe.zrange(keys.running(shard), 0, -1)
        return [i.decode() for ids in pipe.execute() for i in ids]


def job_ids(streams: redis.Redis) -> set[str]:
    """The job ids of every job hash on the streams server."""
    return {k.decode().rsplit(":", 1)[1] for k in streams.scan_iter("ts:{*}:job:*", count=1000)}
