"""Two fakeredis servers standing for the queues and the streams servers (contract/servers.py):
a unit test on them fails if anything reads or writes a key on the wrong one."""

from __future__ import annotations

from dataclasses import dataclass, field

import fakeredis

from contract.servers import Servers


@dataclass
class FakePair:
    queues: fakeredis.FakeServer = field(default_factory=fakeredis.FakeServer)
    streams: fakeredis.FakeServer = field(default_factory=fakeredis.FakeServer)

    def sync(self) -> Servers[fakeredis.FakeRedis]:
        return Servers(
            queues=fakeredis.FakeRedis(server=self.queues), streams=fakeredis.FakeRedis(server=self.streams)
        )

    def aio(self) -> Servers[fakeredis.FakeAsyncRedis]:
        return Servers(
            queues=fakeredis.FakeAsyncRedis(server=self.queues),
            streams=fakeredis.FakeAsyncRedis(server=self.streams),
        )
