"""contract.lua.queues.TAKE on an embedding worker, where keys take turns (fakeredis, real
Lua): the waiting job of the key with the fewest jobs running on the worker goes first, and
the guest slot takes only a job of a key with none running there."""

import fakeredis
import pytest

from contract import keys, tiers
from contract.keys import JobField
from contract.lua import queues

MODEL = "m"
NAMES = list(tiers.queue_names(MODEL))


@pytest.fixture
def r():
    return fakeredis.FakeRedis()


def wait(r, *jobs: tuple[str, str | None], queue: str = tiers.queue_name(MODEL)) -> None:
    """Queue (job id, owner) pairs in order; an owner None has no owner on its record."""
    for job_id, owner in jobs:
        r.rpush(keys.rq_queue_key(queue), job_id)
        if owner is not None:
            r.hset(keys.rq_job(job_id), JobField.OWNER, owner)


def take(r, owners: list[str] | None, guest: bool = False) -> tuple[str, str] | None:
    script = r.register_script(queues.TAKE)
    args = queues.take_args(NAMES, tiers.suspect_queue_name(MODEL), 0, owners, guest)
    got = script(keys=queues.take_keys(NAMES, "w1"), args=args)
    return (got[1].decode(), got[2].decode()) if got else None


def test_a_newcomer_key_s_job_goes_before_a_flooding_key_s_backlog(r):
    wait(r, ("a3", "A"), ("a4", "A"), ("b1", "B"), ("a5", "A"), ("b2", "B"))
    assert take(r, ["A", "A"]) == ("b1", "B")  # B has none running: before A's backlog
    assert take(r, ["A", "A", "B"]) == ("b2", "B")  # B has one, A two
    assert take(r, ["A", "B"]) == ("a3", "A")  # as many each: first come, first taken
    assert take(r, ["A", "B"]) == ("a4", "A")
    assert set(r.hkeys(keys.inbox("w1"))) == {b"b1", b"b2", b"a3", b"a4"}
    assert r.lrange(keys.rq_queue_key(tiers.queue_name(MODEL)), 0, -1) == [b"a5"]


def test_the_guest_slot_takes_only_another_key_s_job(r):
    wait(r, ("a3", "A"), ("a4", "A"))
    assert take(r, ["A", "A"], guest=True) is None  # A's backlog stays for a slot of its own
    assert r.llen(keys.rq_queue_key(tiers.queue_name(MODEL))) == 2
    assert not r.hkeys(keys.inbox("w1"))
    wait(r, ("c1", "C"))
    assert take(r, ["A", "A"], guest=True) == ("c1", "C")
    assert take(r, ["A", "A"]) == ("a3", "A")  # a slot of its own: A's oldest


def test_without_turns_the_first_job_is_taken_whoever_sent_it(r):
    wait(r, ("a3", "A"), ("b1", "B"))
    assert take(r, None) == ("a3", "")
    assert take(r, None) == ("b1", "")


def test_records_without_an_owner_go_first_come_first_taken(r):
    """A server without keys (every owner ""), or records from before owners were written."""
    wait(r, ("x1", None), ("x2", ""), ("x3", None))
    assert [take(r, ["", ""]) for _ in range(3)] == [("x1", ""), ("x2", ""), ("x3", "")]


def test_the_queues_keep_their_order_before_the_turns(r):
    """A higher tier's job (and a continuation) is taken before a lower tier's, whichever key."""
    wait(r, ("b1", "B"))
    wait(r, ("a9", "A"), queue=tiers.queue_name(MODEL, "priority"))
    assert take(r, ["A", "A"]) == ("a9", "A")
    assert take(r, ["A", "A", "A"]) == ("b1", "B")


def test_turns_look_at_the_first_window_of_waiting_jobs(r):
    wait(r, *((f"a{i}", "A") for i in range(queues.TURNS_WINDOW)), ("b1", "B"))
    assert take(r, ["A"]) == ("a0", "A")  # B's is past the window: A's oldest
    assert take(r, ["A"]) == ("b1", "B")  # now within it
