"""api/services.py: the parts a process starts are stopped again, in the reverse order, whether
the process ends or one of them fails to start."""

from __future__ import annotations

import asyncio

import pytest

from api import services as services_module
from api.http.auth import KeyRing
from api.services import Services
from api.settings import Settings, Shared
from devstack.processes import free_port

PARTS = ("ReplicaWatch", "MemoryWatch", "StreamReader", "Reaper")


@pytest.fixture
def parts(monkeypatch) -> list[str]:
    """Each background part's start and stop, as they happen (Redis is never reached)."""
    said: list[str] = []
    for name in PARTS:
        kind = getattr(services_module, name)

        async def start(self, name=name) -> None:
            said.append(f"start {name}")

        async def stop(self, name=name) -> None:
            said.append(f"stop {name}")

        monkeypatch.setattr(kind, "start", start)
        monkeypatch.setattr(kind, "stop", stop)
    return said


def settings() -> Settings:
    return Settings(shared=Shared(redis_url=f"redis://127.0.0.1:{free_port()}/0"))  # nothing listens


def test_close_stops_every_part_in_the_reverse_order_of_their_start(parts):
    async def main() -> None:
        services = await Services.start(settings(), KeyRing(()))
        await services.close()

    asyncio.run(main())
    started = [p for p in parts if p.startswith("start")]
    assert started == [f"start {n}" for n in PARTS]
    assert parts[len(PARTS) :] == [f"stop {n}" for n in reversed(PARTS)]


def test_a_part_that_fails_to_start_leaves_none_of_those_before_it_running(parts, monkeypatch):
    async def broken(self) -> None:
        raise OSError("the reader could not start")

    monkeypatch.setattr(services_module.StreamReader, "start", broken)
    with pytest.raises(OSError):
        asyncio.run(Services.start(settings(), KeyRing(())))
    assert parts == ["start ReplicaWatch", "start MemoryWatch", "stop MemoryWatch", "stop ReplicaWatch"]
