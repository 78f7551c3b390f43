"""The worker loop's choice of queues: suspects only as many as their groups allow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contract import tiers
from worker.intake.rqworker import TokenspoolWorker

SUSPECTS = tiers.suspect_queue_name("m")


def queues(suspects: int, cap: int) -> list[str]:
    runner = SimpleNamespace(
        running_suspects=lambda: (suspects, cap), running_batch_lines=lambda: 0, running=lambda: suspects
    )
    lending = SimpleNamespace(batch_limit=lambda interactive_running: 1)
    worker = SimpleNamespace(_model="m", name="w1", _runner=runner, _lending=lending)
    return TokenspoolWorker._queues(worker)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("suspects", "cap", "takes"),
    [(0, 0, True), (5, 0, True), (1, 2, True), (2, 2, False), (1, 1, False), (3, 2, False)],
)
def test_the_suspect_queue_while_the_group_has_room(suspects, cap, takes):
    """A worker running `suspects` of them, the least group of theirs `cap` (0: any), takes
    another only if the group may grow (TAKE then picks one whose own group allows it)."""
    names = queues(suspects, cap)
    assert (SUSPECTS in names) == takes
    assert names[-1] == tiers.queue_name("m", tiers.BATCH)  # the rest as ever
