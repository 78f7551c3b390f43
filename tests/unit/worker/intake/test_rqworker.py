"""The worker loop's choice of queues: suspects only as many as their groups allow."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from contract import tiers
from worker.intake.rqworker import TokenspoolWorker

SUSPECTS = tiers.suspect_queue_name("m")


def queues(suspects: int, cap: int, forming: bool = True, turn: bool = True) -> list[str]:
    """`turn`: the continuations read again here have had theirs (worker/attempts/proofs.py)."""
    runner = SimpleNamespace(
        running_suspects=lambda: (suspects, cap),
        proof_may_start=lambda: turn and not suspects,  # no new group while one proves
        running_batch_lines=lambda: 0,
        running=lambda: suspects,
    )
    lending = SimpleNamespace(batch_limit=lambda interactive_running: 1)
    worker = SimpleNamespace(_model="m", name="w1", _runner=runner, _lending=lending, _forming=forming)
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


def test_a_group_grows_only_while_it_forms_and_forms_only_in_its_turn():
    """A crash storm: a worker that took each suspect as the last cleared held the jobs it
    was reading again behind one proof after another (streams 20 s without a token)."""
    assert SUSPECTS not in queues(3, 0, forming=False)  # the group closed: no more join it
    assert SUSPECTS in queues(0, 0, forming=False)  # a new group may form
    assert SUSPECTS not in queues(0, 0, turn=False)  # not in the continuations' turn
    assert SUSPECTS in queues(2, 0, forming=True, turn=False)  # a group forming goes on
