"""What a demoted primary answers is never taken as the primary's word. Behind one name (a
managed Redis), a connection opened before a failover still reaches the old primary, now a
replica, and until its resync ends (seconds: a primary delays a full sync by
`repl-diskless-sync-delay`, 5 s by default) it answers reads from its own data, which lacks
what was written on the new primary since. Here a replica held behind stands for it.

Found by test_failover.py ("one name"), beside a busy lane: after the fail-back, the worker
took a new job from the new primary, then read its RQ record through a connection still on
the demoted node, found none, and dropped the job as gone. The API queued it again four
times (its own read there said the queue entry was lost), each taken and dropped the same
way, and the client waited until its timeout."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import redis

from contract import keys
from contract.failover import pool
from contract.keys import JOB_FUNCTION
from devstack.processes import start_managed
from worker.intake.rqworker import TokenspoolWorker

pytestmark = pytest.mark.integration

JOB = "chatcmpl-abc"


class Runner(SimpleNamespace):
    """A job runner that records what the loop asks of it."""

    def __init__(self) -> None:
        super().__init__(started=[], unreserved=0, queue_opened=None)

    def start(self, spec: dict, rq_job_id: str, owner: str = "") -> None:
        self.started.append(rq_job_id)

    def unreserve(self) -> None:
        self.unreserved += 1

    def running(self) -> int:
        return 0


def test_a_taken_job_is_never_dropped_as_gone_on_a_demoted_primary_s_word(tmp_path):
    watched = start_managed(tmp_path, held_link=True)
    try:
        assert watched.link is not None
        watched.link.pause()  # from here on the replica lacks every write
        rq_job = keys.rq_job(keys.rq_job_id(JOB, 0))
        with redis.Redis(port=watched.ports["primary"], socket_timeout=5) as primary:
            primary.hset(rq_job, "data", json.dumps([JOB_FUNCTION, None, [{"id": JOB}], {}]))
            primary.hset(keys.inbox("w"), keys.rq_job_id(JOB, 0), 1)
        stale = redis.Redis(connection_pool=pool(f"redis://127.0.0.1:{watched.ports['replica']}/0"))
        runner = Runner()
        lending = SimpleNamespace(interactive_queues=())
        worker = TokenspoolWorker("m", "w", stale, runner, lending)  # type: ignore[arg-type]
        worker._stop_requested = True  # a settle that fails once gives up rather than retry
        with pytest.raises(redis.ConnectionError):  # the demoted node: reconnect, by the name
            worker._execute(keys.rq_job_id(JOB, 0))
        assert runner.unreserved == 1 and not runner.started  # its slot back; taken again after
        with redis.Redis(port=watched.ports["primary"], socket_timeout=5) as primary:
            assert primary.exists(rq_job) and primary.hexists(keys.inbox("w"), keys.rq_job_id(JOB, 0))
        # by the name, on the primary: it runs, and then leaves the inbox
        fresh = redis.Redis(connection_pool=pool(f"redis://127.0.0.1:{watched.ports['primary']}/0"))
        TokenspoolWorker("m", "w", fresh, runner, lending)._execute(keys.rq_job_id(JOB, 0))  # type: ignore[arg-type]
        assert runner.started == [keys.rq_job_id(JOB, 0)]
        assert not fresh.exists(rq_job) and not fresh.hexists(keys.inbox("w"), keys.rq_job_id(JOB, 0))
    finally:
        for relay in (watched.link, watched.name):
            if relay is not None:
                relay.close()
        for p in watched.procs():
            p.stop()
