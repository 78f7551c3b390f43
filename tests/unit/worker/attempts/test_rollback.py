"""A failover that loses the last writes (docs/protocol.md, "Failover"), on fakeredis with real
Lua: the job's keys are put back as a snapshot taken earlier, as a promoted replica that
missed the primary's last second holds them; the attempt that wrote what was lost writes it
again with the ids it had."""

import time

import fakeredis
import pytest
import redis

from contract import entries, keys
from contract.entries import Delta, Finished, Started
from contract.keys import JobField
from contract.lua import library
from contract.settings import Recovery
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts import durability as durability_module
from worker.attempts.attempt import Attempt, Claims, Fenced, RolledBack
from worker.attempts.durability import Durability
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)
CID = "chatcmpl-rollback"
JOB_KEYS = library.job_keys(CID)


@pytest.fixture
def r():
    client = fakeredis.FakeRedis()
    record_queued(client, CID)
    client.expire(keys.job(CID), 1000)
    client.zadd(keys.pending(keys.shard(CID)), {CID: 1})
    return client


def snapshot(r) -> dict[str, bytes | None]:
    return {k: r.dump(k) for k in JOB_KEYS}


def roll_back(r, snap: dict[str, bytes | None]) -> None:
    """The job's keys as they were at `snap`: what a replica that missed the rest holds."""
    for k, data in snap.items():
        r.delete(k)
        if data is not None:
            r.restore(k, 0, data)


def rows(r) -> list[tuple[bytes, object]]:
    return [(i, entries.decode(f)) for i, f in r.xrange(keys.events(CID))]


def test_entries_a_failover_lost_are_written_again_with_their_ids_before_the_next(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    pub.started(a, 5)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    snap = snapshot(r)
    pub.delta(a, "b", (2,))
    pub.delta(a, "c", (3,))
    pub.flush(a)
    seen = rows(r)  # what a client was sent
    roll_back(r, snap)
    assert len(rows(r)) == 2
    pub.delta(a, "d", (4,))
    pub.finished(a, "stop", 5, 4)
    after = rows(r)
    assert after[: len(seen)] == seen  # the same events, the same ids
    assert [e.text for _, e in after if isinstance(e, Delta)] == ["a", "b", "c", "d"]
    assert r.hget(keys.job(CID), JobField.STATUS) == b"done"
    assert r.hget(keys.job(CID), JobField.SEQ) == b"6"


def test_an_append_whose_reply_was_lost_is_written_on_the_promoted_replica_with_its_ids(r):
    """A primary killed after it ran an APPEND but before it replied: the worker retries on
    the promoted replica, which lacks what was written, while a client may have been sent it
    from the old primary. Written there with new ids, it would be sent to that client twice
    (the failover test, once in some runs: a token twice). The worker chooses each entry's
    id, so the retry writes the ids a client may hold."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    pub.started(a, 5)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    lost = _LostReply(r, snapshot(r))
    pub = Publisher(Link(lost, "w1", RECOVERY))  # type: ignore[arg-type]
    pub.delta(a, "b", (2,))
    pub.flush(a)
    assert lost.sent and [e.text for _, e in lost.sent if isinstance(e, Delta)] == ["a", "b"]
    assert rows(r) == lost.sent  # the same entries, the same ids


class _LostReply:
    """A streams client whose next pipeline runs, then loses its reply in a failover to a
    replica that lacks what it wrote (`snap`)."""

    def __init__(self, r, snap: dict[str, bytes | None]) -> None:
        self._r, self._snap = r, snap
        self.sent: list[tuple[bytes, object]] = []  # what a client was sent from the old primary

    def pipeline(self, *args, **kwargs):
        pipe = self._r.pipeline(*args, **kwargs)
        if self.sent:
            return pipe
        run = pipe.execute

        def execute(*a, **k):
            run(*a, **k)
            self.sent = rows(self._r)
            roll_back(self._r, self._snap)
            raise redis.ConnectionError("the primary died before it replied")

        pipe.execute = execute
        return pipe

    def __getattr__(self, name):
        return getattr(self._r, name)


def test_a_lost_claim_is_claimed_again_by_the_heartbeat_and_a_second_copy_is_refused(r):
    snap = snapshot(r)  # queued, its claim not yet made
    link = Link(r, "w1", RECOVERY)
    pub = Publisher(link)
    heartbeat = Heartbeat(r, 3000, 1.0)
    heartbeat.rolled_back = pub.resend
    a = Claims(link, 3000).claim(CID, DIGEST)
    heartbeat.track(a)
    pub.started(a, 5)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    seen = rows(r)
    roll_back(r, snap)  # the claim and both entries lost
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    heartbeat.beat()  # BEAT answers 2: the attempt writes again what it holds
    pub.flush(a)
    assert rows(r) == seen
    job = r.hgetall(keys.job(CID))
    assert job[JobField.STATUS.encode()] == b"running" and int(job[JobField.EPOCH.encode()]) == a.epoch
    assert r.zscore(keys.running(keys.shard(CID)), CID) is not None
    assert r.zscore(keys.pending(keys.shard(CID)), CID) is None
    assert r.get(keys.alive(CID)) == str(a.epoch).encode()
    # the queue entry the failover put back reaches another worker: its claim is refused
    with pytest.raises(Exception, match=CID):
        Claims(Link(r, "w2", RECOVERY), 3000).claim(CID, DIGEST)
    pub.finished(a, "stop", 5, 1)
    assert isinstance(rows(r)[-1][1], Finished)


def test_another_attempt_that_claimed_the_rolled_back_job_first_fences_this_one_out(r):
    snap = snapshot(r)
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    pub.started(a, 5)
    pub.flush(a)
    roll_back(r, snap)
    b = Claims(Link(r, "w2", RECOVERY), 3000).claim(CID, DIGEST)  # the same epoch, its own token
    assert b.epoch == a.epoch
    pub.delta(a, "a", (1,))
    with pytest.raises(Fenced):
        pub.flush(a)
    assert rows(r) == []  # nothing of the fenced attempt


def _started(r, publishing, server) -> tuple[Publisher, Attempt, Durability]:
    """An attempt that wrote its start and a token (through `publishing`), with a durability
    check that has seen `server` once."""
    pub = Publisher(Link(publishing, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    durability = Durability(server)
    durability.resend = pub.resend
    durability.track(a)
    pub.started(a, 5)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    durability.check()
    return pub, a, durability


class _Pool:
    def __init__(self, server: "_Server") -> None:
        self._server = server

    def disconnect(self) -> None:
        self._server.reconnect()


def test_behind_one_name_a_check_that_meets_the_demoted_primary_reconnects_to_the_new_one(r):
    """Behind one name, connections opened before a managed failover stay with the old
    primary, which, a replica now, still answers INFO: the check drops them, and its next
    look, through the name, meets the new primary and has the ended attempt write its end
    again (the one-name failover test: a job that ended while the replica was held behind
    was never written again, and ran again with other text)."""
    publishing = _Name(r)
    server = _Server(r, run_id="first")
    pub, a, durability = _started(r, publishing, server)
    promoted = _replica_of(r)
    pub.finished(a, "stop", 5, 1)  # the replica held behind: the old primary's alone
    seen = rows(r)
    publishing.target = promoted  # the publisher's next write met READONLY and moved

    def through_the_name() -> None:
        server._r, server.role, server.run_id = promoted, "master", "promoted"

    server.role, server.reconnect = "slave", through_the_name  # demoted, still answering
    durability.check()
    durability.check()
    pub.flush(a)
    assert [(i, entries.decode(f)) for i, f in promoted.xrange(keys.events(CID))] == seen


def test_an_ended_attempt_writes_its_end_again_when_the_server_changed(r):
    server = _Server(r, run_id="first")
    pub, a, durability = _started(r, r, server)
    snap = snapshot(r)
    pub.finished(a, "stop", 5, 1)
    seen = rows(r)
    roll_back(r, snap)
    server.run_id = "promoted"  # a failover: another server answers
    durability.check()
    pub.flush(a)
    assert rows(r) == seen
    assert r.hget(keys.job(CID), JobField.STATUS) == b"done"


def test_entries_a_replica_acknowledged_are_forgotten_and_the_rest_held(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="one", offset=100, replica=100)
    durability = Durability(server)  # type: ignore[arg-type]
    durability.track(a)
    pub.started(a, 5)
    pub.delta(a, "a", (1,))
    pub.flush(a)
    durability.check()  # written before offset 100, which the replica has
    assert a.record == []
    pub.delta(a, "b", (2,))
    pub.flush(a)
    server.offset = 200  # the replica stays at 100: held
    durability.check()
    assert [e.text for _, _, e in a.record] == ["b"]  # type: ignore[union-attr]
    server.replica = 200
    durability.check()
    assert a.record == []
    pub.finished(a, "stop", 5, 2)
    server.offset = server.replica = 300
    durability.check()
    assert durability.tracked == 0  # ended, nothing held


def test_with_two_replicas_entries_are_held_until_both_have_them(r):
    """A failover may promote either (the sentinels pass over one that is down or cut off,
    however far it got): an entry is safe once every replica has acknowledged it."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="one", offset=100, replica=100)
    server.second = 100
    durability = Durability(server)  # type: ignore[arg-type]
    durability.track(a)
    pub.started(a, 5)
    pub.flush(a)
    durability.check()  # written before offset 100
    server.offset, server.replica = 200, 200  # one replica has it all, the other lags
    pub.delta(a, "b", (2,))
    pub.flush(a)
    durability.check()  # written before offset 200
    server.offset = 300
    durability.check()
    assert len(a.record) == 1  # the first entry: both have it; the second: only one
    server.second = 200
    durability.check()
    assert a.record == []


def test_without_replicas_entries_are_held_until_synced(r, monkeypatch):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="one", offset=100, replica=None)
    durability = Durability(server, fsync_s=0.2)  # type: ignore[arg-type]
    durability.track(a)
    pub.started(a, 5)
    pub.flush(a)
    durability.check()
    assert len(a.record) == 1
    time.sleep(0.25)
    durability.check()
    assert a.record == []


def test_a_rollback_past_what_a_replica_confirmed_cannot_be_papered_over(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    snap = snapshot(r)
    pub.started(a, 5)
    pub.flush(a)
    a.confirm(a.written)  # as if a replica had it: forgotten
    roll_back(r, snap)
    pub.delta(a, "a", (1,))
    with pytest.raises(RolledBack):
        pub.flush(a)


def test_the_record_numbers_an_attempts_entries_from_its_first(r):
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    pub.started(a, 5)
    pub.flush(a)
    assert isinstance(rows(r)[0][1], Started)
    assert isinstance(a, Attempt) and a.record[0][0] == 0


class _Server:
    """The streams server as worker/attempts/durability.py sees it: fakeredis for the job's keys, and
    an INFO (which fakeredis lacks) saying who answers and how far its replica got."""

    def __init__(self, r, run_id: str, offset: int = 0, replica: int | None = 0) -> None:
        self._r = r
        self.run_id, self.offset, self.replica = run_id, offset, replica
        self.syncing = False  # a replica connected but still loading the primary's data
        self.backlog = False  # it has had a replica (within repl-backlog-ttl)
        self.second: int | None = None  # a second replica's offset
        self.role = "master"
        self.reconnect = lambda: None  # what dropping its connections leads to

    @property
    def connection_pool(self) -> "_Pool":
        return _Pool(self)

    def execute_command(self, *args):
        assert args == ("INFO", "server", "replication")
        info = {"role": self.role, "run_id": self.run_id, "master_repl_offset": self.offset}
        if self.replica is not None:
            info["slave0"] = {"ip": "127.0.0.1", "port": 1, "state": "online", "offset": self.replica}
        elif self.syncing:
            info["slave0"] = {"ip": "127.0.0.1", "port": 1, "state": "wait_bgsave", "offset": 0}
        if self.second is not None:
            info["slave1"] = {"ip": "127.0.0.1", "port": 2, "state": "online", "offset": self.second}
        info["connected_slaves"] = int(self.replica is not None or self.syncing) + (self.second is not None)
        info["repl_backlog_active"] = int(self.backlog or info["connected_slaves"] > 0)
        return info

    def __getattr__(self, name):
        return getattr(self._r, name)


def test_a_server_that_just_lost_its_replica_is_not_trusted_alone(r):
    """A primary the sentinels replaced has lost its replica to the promotion, and takes
    writes until it is demoted: what it takes then is held, not counted as synced."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="one", offset=100, replica=100)
    durability = Durability(server, fsync_s=0.1)  # type: ignore[arg-type]
    durability.track(a)
    durability.check()
    server.replica = None  # promoted away
    pub.started(a, 5)
    pub.flush(a)
    server.offset = 200
    durability.check()
    time.sleep(0.15)
    durability.check()
    assert len(a.record) == 1


def test_a_worker_that_starts_beside_a_primary_that_had_replicas_does_not_trust_it_alone(r):
    """A worker started (after a kill) while the sentinels' replaced primary still takes
    writes cannot tell when its replica left: a primary with none but an active backlog is
    taken to have just lost it, and what is written there is held."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="one", offset=100, replica=None)
    server.backlog = True
    durability = Durability(server, fsync_s=0.05)  # type: ignore[arg-type]
    durability.track(a)
    pub.started(a, 5)
    pub.flush(a)
    durability.check()
    time.sleep(0.1)
    durability.check()
    assert len(a.record) == 1


def test_a_restarted_server_whose_replica_is_still_syncing_is_not_trusted_alone(r):
    """After a primary restarts its replica loads its data anew; a failover meanwhile promotes
    that replica, without what the primary took since. Nothing is counted synced by time."""
    pub = Publisher(Link(r, "w1", RECOVERY))
    a = Claims(Link(r, "w1", RECOVERY), 3000).claim(CID, DIGEST)
    server = _Server(r, run_id="before", offset=100, replica=None)
    server.syncing = True
    durability = Durability(server, fsync_s=0.05)  # type: ignore[arg-type]
    durability.resend = pub.resend
    durability.track(a)
    durability.check()
    server.run_id = "restarted"
    durability.check()
    pub.started(a, 5)
    pub.flush(a)
    durability.check()
    time.sleep(0.1)
    durability.check()
    assert len(a.record) == 1  # held until the replica acknowledges it
    server.syncing, server.replica, server.offset = False, 300, 300
    durability.check()
    assert a.record == []


def _replica_of(r) -> fakeredis.FakeRedis:
    """A server holding the job's keys as `r` has them now: a replica promoted later."""
    promoted = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    for k, data in snapshot(r).items():
        if data is not None:
            promoted.restore(k, 0, data)
    return promoted


class _Name:
    """A client whose connections reach whichever server `target` is now: through Sentinel,
    a pooled connection can still reach the replaced primary (which takes writes until it is
    demoted) after another connection found the promoted one."""

    def __init__(self, target) -> None:
        self.target = target

    def __getattr__(self, name):
        return getattr(self.target, name)


def test_an_end_written_again_to_the_replaced_primary_is_written_again_to_the_new_one(r):
    """The durability check meets the promoted server first and writes the ended attempt's
    end again, but the publisher's connection still reaches the replaced primary, where it
    is already: a later look, once the publisher reaches the new primary, writes it there
    (chaos at the defaults: a job run again after its end was lost, with other text)."""
    publishing = _Name(r)
    server = _Server(r, run_id="old")
    pub, a, durability = _started(r, publishing, server)
    promoted = _replica_of(r)
    pub.finished(a, "stop", 5, 1)  # to the replaced primary, which still takes writes
    seen = rows(r)
    server._r, server.run_id = promoted, "promoted"  # the check's connection: the new one
    durability.check()  # writes the end again, to the replaced primary: nothing to do there
    publishing.target = promoted  # the publisher's connection moves too
    durability.check()
    assert [(i, e) for i, e in promoted.xrange(keys.events(CID))] == [
        (i, f) for i, f in r.xrange(keys.events(CID))
    ]
    assert [(i, entries.decode(f)) for i, f in promoted.xrange(keys.events(CID))] == seen
    assert promoted.hget(keys.job(CID), JobField.STATUS) == b"done"


def test_a_replica_is_expected_while_the_server_has_or_lately_had_one(r, monkeypatch):
    """Where one is, an attempt waits for a replica to hold its claim (worker/attempts/rules.py)."""
    server = _Server(r, run_id="one", offset=100, replica=None)
    durability = Durability(server)  # type: ignore[arg-type]
    assert durability.replicas_expected(CID) == 0  # not looked yet: nothing known
    durability.check()
    assert durability.replicas_expected(CID) == 0  # never had one
    server.replica = 100
    durability.check()
    assert durability.replicas_expected(CID) == 1
    server.second = 100
    durability.check()
    assert durability.replicas_expected(CID) == 2  # either may be promoted: both must have it
    server.replica = server.second = None
    durability.check()
    assert durability.replicas_expected(CID) == 1  # just lost it
    monkeypatch.setattr(durability_module, "REMEMBER_S", 0.0)
    assert durability.replicas_expected(CID) == 0


def test_a_started_worker_knows_its_replicas_before_it_takes_a_job(r):
    """The first look is made before `start` returns, not on the thread beside the first
    claim: a claim made before it would not wait for the replica (a failover test, once)."""
    server = _Server(r, run_id="one", offset=100, replica=100)
    info = server.execute_command
    server.execute_command = lambda *args: time.sleep(0.3) or info(*args)  # a slow answer
    durability = Durability(server, period_s=60)  # type: ignore[arg-type]
    durability.start()
    try:
        assert durability.replicas_expected(CID) == 1
    finally:
        durability.stop()


def test_a_worker_started_while_redis_is_away_starts_and_looks_later(r):
    server = _Server(r, run_id="one", offset=100, replica=100)
    server.execute_command = lambda *args: (_ for _ in ()).throw(redis.ConnectionError("away"))
    durability = Durability(server, period_s=60)  # type: ignore[arg-type]
    durability.start()
    durability.stop()
    assert durability.replicas_expected(CID) == 0
