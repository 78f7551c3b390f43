"""This worker's line to the jobs in Redis. It holds the clients of the two servers
(contract/keys.py) and the name the worker writes under. It holds the recovery settings it shares
with the API, and how long a call rides out a Redis outage. Claiming, publishing and handing off
all go through one `Link`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from contract.servers import Servers
from contract.settings import Recovery
from worker.redis.outage import Outage
from worker.redis.retrying import retry

T = TypeVar("T")


@dataclass(frozen=True)
class Link:
    # the queues server (REDIS_URL)
    client: redis.Redis
    worker: str
    recovery: Recovery
    redis_wait_s: float = 60.0
    outage: Outage = field(default_factory=lambda: Outage("publishing"))
    # STREAMS_REDIS_URL's server; None: the same one
    streams_client: redis.Redis | None = None

    @property
    def streams(self) -> redis.Redis:
        """The client of the job hashes and streams."""
        return self.streams_client or self.client

    @property
    def servers(self) -> Servers[redis.Redis]:
        return Servers(queues=self.client, streams=self.streams)

    def retry(self, call: Callable[[], T]) -> T:
        """Run a Redis call, riding out a restart or failover for up to `redis_wait_s`."""
        return retry(call, self.redis_wait_s, self.outage)
