"""The two Redis roles a process talks to (contract/keys.py says which key lives where).

`queues` is REDIS_URL's server; `streams` is STREAMS_REDIS_URL's, the same client when the
variable is unset, so a deployment with one Redis behaves as it always did. Both sides hold
one `Servers` of sync clients (the API's RQ calls, the workers) or of asyncio clients (the
API's handlers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True)
class Servers(Generic[C]):
    queues: C  # RQ's queues and records, the worker registry, stats, owners, files, batches
    streams: C  # job hashes, event streams, heartbeats and their shards' indexes

    @property
    def split(self) -> bool:
        """Two servers (or clients) rather than one."""
        return self.queues is not self.streams

    def each(self) -> list[C]:
        """Each distinct client once."""
        return [self.queues, self.streams] if self.split else [self.queues]
