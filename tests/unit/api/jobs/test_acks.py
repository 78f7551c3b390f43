"""Confirming a new job across a failover (api/jobs/acks.py `confirm_new_job`), with a
stand-in for the servers' confirmations."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from api.jobs import acks
from api.jobs.acks import RedoSteps, confirm_new_job


@dataclass
class Primary:
    """A server that holds the job or not; its confirmations take `round_s` each."""

    holds: bool = False
    round_s: float = 0.0
    rounds: int = 0

    async def settled(self, key: str | None = None) -> bool:
        """Never: no replica acknowledges (it is away), whether or not the job is here."""
        self.rounds += 1
        await asyncio.sleep(self.round_s)
        return False


@dataclass
class Pair:
    streams: Primary
    split: bool = False
    recorded: list[str] = field(default_factory=list)

    @property
    def queues(self) -> Primary:
        return self.streams

    def again(self) -> RedoSteps:
        async def record() -> bool:
            made = not self.streams.holds
            self.streams.holds = True
            self.recorded.append("record")
            return made

        async def entry_lost() -> bool:
            return False

        async def enqueue() -> None:
            self.recorded.append("enqueue")

        return RedoSteps(record, entry_lost, enqueue)


def test_a_job_the_primary_lacks_when_the_wait_runs_out_is_recorded_there_before_it_is_answered(monkeypatch):
    # The failover came while the job waited for a replica: by the time the first round
    # answers (the new primary lacks the job), the wait has run out. Answering then, without
    # recording it where the primary is now, answered for a job that was lost.
    monkeypatch.setattr(acks, "CONFIRM_FOR_S", 0.1)
    pair = Pair(Primary(holds=False, round_s=0.2))
    asyncio.run(confirm_new_job(pair, "job-1", pair.again()))  # type: ignore[arg-type]
    assert pair.streams.holds and pair.recorded == ["record", "enqueue"]


def test_a_job_the_primary_holds_is_not_recorded_again_and_the_wait_is_bounded(monkeypatch):
    monkeypatch.setattr(acks, "CONFIRM_FOR_S", 0.3)
    pair = Pair(Primary(holds=True))
    asyncio.run(confirm_new_job(pair, "job-1", pair.again()))  # type: ignore[arg-type]
    assert pair.recorded == ["record"] * len(pair.recorded)  # looked at, never made again
    assert not pair.recorded.count("enqueue") and pair.streams.rounds >= 2
