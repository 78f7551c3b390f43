"""The Lua scripts seen from outside contract/lua/attempts.py and jobs.py (on fakeredis with real
Lua): the worker's publisher and progress over them, and queues.TAKE's order of queues and suspects.
Each job-stream script's own tests are test_attempts.py's, test_jobs.py's and test_library.py's."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from contract import keys, tiers
from contract.keys import JobField
from contract.lua import queues
from tests.unit.contract.lua.job import CID, RECOVERY, abandon
from tests.unit.recorded import DIGEST
from worker.attempts.attempt import Claims
from worker.attempts.publisher import Publisher
from worker.redis.link import Link


def test_other_redis_errors_are_not_mistaken_for_fencing(r, monkeypatch):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)

    def refused(todo):
        return [redis.ResponseError("OOM command not allowed") for _ in todo]

    monkeypatch.setattr(pub, "_append_all", refused)
    with pytest.raises(redis.ResponseError):
        pub.finished(a, "stop", 1, 1)


def test_progress_collects_every_published_token_id(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    a = claims.claim(CID, DIGEST)
    pub.started(a, 9)
    pub.delta(a, "ab", (1, 2))
    pub.delta(a, "c", (3,))
    pub.flush(a)
    abandon(r, a.epoch)
    b = claims.claim(CID, DIGEST)
    pub.started(b, 9)
    pub.delta(b, "d", (4,))
    pub.flush(b)
    p = claims.progress(CID)
    assert p.prompt_tokens == 9 and p.token_ids == (1, 2, 3, 4)


def test_take_moves_one_id_into_the_inbox_in_queue_order():
    r = fakeredis.FakeRedis()
    take = r.register_script(queues.TAKE)
    r.rpush(keys.rq_queue_key("m"), "new-1")
    r.rpush(keys.rq_queue_key(tiers.suspect_queue_name("m")), "suspect-1")
    names, new = tiers.queue_names("m"), [tiers.queue_name("m")]
    both = queues.take_keys(names, "w1")
    args = queues.take_args(names, tiers.suspect_queue_name("m"), 0)
    assert take(keys=both, args=args)[1] == b"suspect-1"  # suspects first
    new_args = queues.take_args(new, tiers.suspect_queue_name("m"), 0)
    assert take(keys=queues.take_keys(new, "w1"), args=new_args)[1] == b"new-1"
    assert not take(keys=both, args=args)
    assert set(r.hkeys(keys.inbox("w1"))) == {b"suspect-1", b"new-1"}


def test_take_gives_a_worker_only_suspects_that_may_step_with_its_own():
    """A worker running n suspects takes the first waiting one whose group allows n + 1."""
    r = fakeredis.FakeRedis()
    take = r.register_script(queues.TAKE)
    suspects = tiers.suspect_queue_name("m")
    names = list(tiers.queue_names("m"))
    r.rpush(keys.rq_queue_key(suspects), "s-old", "s-2", "s-any", "s-3")
    r.hset(keys.rq_job("s-2"), JobField.GROUP, 2)
    r.hset(keys.rq_job("s-any"), JobField.GROUP, 0)
    r.hset(keys.rq_job("s-3"), JobField.GROUP, 3)
    r.rpush(keys.rq_queue_key(tiers.queue_name("m")), "new-1")

    def taken(stepping: int) -> bytes:
        return take(keys=queues.take_keys(names, "w1"), args=queues.take_args(names, suspects, stepping))[1]

    assert taken(2) == b"s-any"  # a third: not s-2
    assert taken(2) == b"s-3"
    assert taken(2) == b"new-1"  # s-2 waits for a worker with one suspect at most
    assert taken(1) == b"s-2"
    assert taken(0) == b"s-old"  # an earlier release's: no group, alone
    no_suspects = [n for n in names if n != suspects]
    assert (
        take(keys=queues.take_keys(no_suspects, "w1"), args=queues.take_args(no_suspects, suspects, 0))
        is None
    )
