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


def test_a_worker_told_to_stop_while_it_waits_takes_nothing():
    """SIGTERM arrives while the loop waits for a wake. The runner hands the running job off
    after its grace, which enqueues its continuation and wakes the idle workers: this one too.
    It took the continuation, claimed it and handed it off again (CI: three attempts where a
    trace test wanted two)."""
    taken: list[list[str]] = []
    worker = SimpleNamespace(_model="m", name="w1", _stop_requested=False, _forming=True)
    worker._queues = lambda: ["q"]

    def blpop(names, timeout):  # the signal handler runs while the loop waits
        worker._stop_requested = True
        return [b"tokenspool:wake", b"1"]

    worker.connection = SimpleNamespace(blpop=blpop)
    worker._take_from = lambda names: taken.append(names)  # nothing waits before the signal
    assert TokenspoolWorker._take_one(worker) is None  # type: ignore[arg-type]
    assert taken == [["q"]]  # the take before the wait, none after it

    worker._take_from = lambda names: taken.append(names) or [b"q", b"job", b""]
    assert TokenspoolWorker._take_one(worker) is None  # type: ignore[arg-type]
    assert taken == [["q"]]  # asked to stop: no take at all
