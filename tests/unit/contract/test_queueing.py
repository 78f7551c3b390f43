"""contract.queueing: where a job's attempts land on its model's queues (fakeredis, real Lua;
two servers, queues and streams, as with STREAMS_REDIS_URL)."""

import json

import fakeredis

from contract import keys, queueing, stats, tiers
from contract.keys import JobField, JobStatus
from contract.lua import queues
from contract.servers import Servers
from contract.settings import Recovery
from tests.fake_servers import FakePair
from worker.attempts.attempt import Claims
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)
MODEL = "m"


def record(servers: Servers[fakeredis.FakeRedis], job_id: str, priority: str = "default") -> None:
    spec = {"id": job_id, "model": MODEL, "kind": "chat", "priority": priority}
    servers.streams.hset(
        keys.job(job_id),
        mapping={
            JobField.STATUS: JobStatus.QUEUED,
            JobField.EPOCH: 0,
            JobField.DIGEST: "d",
            JobField.SPEC: json.dumps(spec),
        },
    )
    queueing.enqueue(servers, spec, 0, RECOVERY)


def test_a_new_job_waits_behind_the_queue():
    servers = FakePair().sync()
    for job_id in ("a", "b", "c"):
        record(servers, job_id)
    assert servers.queues.lrange(keys.queue_key(MODEL), 0, -1) == [
        keys.rq_job_id(c, 0).encode() for c in "abc"
    ]


def test_a_continuation_goes_to_the_front_of_its_queue():
    # Found by bench/faults/chaos.py: a continuation queued behind a deep backlog outwaited
    # RESUME_WAIT_SECONDS and its client, mid-stream, got worker_lost with no worker dead twice.
    servers = FakePair().sync()
    record(servers, "running")
    servers.queues.lpop(keys.queue_key(MODEL))  # a worker took it
    link = Link(servers.queues, "w1", RECOVERY, streams_client=servers.streams)
    attempt = Claims(link, 3000).claim("running", "d")
    for job_id in ("x", "y", "z"):
        record(servers, job_id)
    assert queueing.abandon(servers, "running", attempt.epoch, RECOVERY, "crash", charge=True).outcome == 1
    assert servers.queues.hget(keys.STATS, stats.StatField.requeued("crash")) == b"1"
    assert taken(servers.queues) == [
        keys.rq_job_id(c, e) for c, e in [("running", attempt.epoch + 1), *zip("xyz", [0] * 3, strict=True)]
    ]


def taken(r: fakeredis.FakeRedis, suspects: int = 0) -> list[str]:
    """Job ids in the order a worker running `suspects` suspects takes them (contract.lua.queues.TAKE)."""
    take = r.register_script(queues.TAKE)
    names = tiers.queue_names(MODEL)
    args = queues.take_args(names, tiers.suspect_queue_name(MODEL), suspects)
    out = []
    while got := take(keys=queues.take_keys(names, "w"), args=args):
        out.append(got[1].decode())
    return out


def test_a_suspect_s_group_travels_with_its_queue_entry():
    """A suspect that died in a group of 4 waits with its new group (2) on RQ's record, where
    TAKE reads it: a worker running two suspects does not take it, one running one does."""
    servers = FakePair().sync()
    record(servers, "s")
    servers.queues.lpop(keys.queue_key(MODEL))
    servers.streams.hset(keys.job("s"), mapping={JobField.SUSPECT: "1", JobField.GROUP: "0"})
    link = Link(servers.queues, "w1", RECOVERY, streams_client=servers.streams)
    attempt = Claims(link, 3000).claim("s", "d")
    done = queueing.abandon(servers, "s", attempt.epoch, RECOVERY, "crash", charge=False, group=4)
    assert (done.outcome, done.suspect, done.charged, done.group) == (1, True, False, 2)
    assert taken(servers.queues, suspects=2) == []
    assert taken(servers.queues, suspects=1) == [keys.rq_job_id("s", attempt.epoch + 1)]
    assert servers.streams.zscore(keys.pending(keys.shard("s")), "s") is None  # enqueued


def test_suspects_wait_in_the_order_they_were_requeued():
    """A crash storm (bench/faults/chaos.py --storm): with each death's suspects pushed in front,
    an earlier death's waited 52-75 s in the suspect queue while later ones were taken."""
    servers = FakePair().sync()
    for job_id in ("first", "second", "third"):
        queueing.enqueue(servers, {"id": job_id, "model": MODEL}, 3, RECOVERY, suspect=True)
    assert taken(servers.queues) == [keys.rq_job_id(c, 3) for c in ("first", "second", "third")]


def test_workers_take_the_tiers_in_order_and_a_continuation_first():
    servers = FakePair().sync()
    for job_id, tier in (
        ("f", "flex"),
        ("d", "default"),
        ("p", "priority"),
        ("f2", "flex"),
        ("d2", "default"),
    ):
        record(servers, job_id, tier)
    assert taken(servers.queues) == [keys.rq_job_id(c, 0) for c in ("p", "d", "d2", "f", "f2")]
    queueing.enqueue(
        servers, {"id": "f", "model": MODEL, "priority": "flex"}, 3, RECOVERY
    )  # a flex continuation
    record(servers, "p2", "priority")
    assert taken(servers.queues) == [keys.rq_job_id("f", 3), keys.rq_job_id("p2", 0)]


def owners_waiting(r: fakeredis.FakeRedis) -> dict[str, str]:
    """Each waiting RQ job id's owner, as TAKE reads it from its record."""
    out = {}
    for queue in keys.queue_keys(MODEL):
        for raw in r.lrange(queue, 0, -1):
            owner = r.hget(keys.rq_job(raw.decode()), JobField.OWNER)
            out[raw.decode()] = owner.decode() if owner is not None else None
    return out


def test_a_job_s_owner_waits_on_its_record_as_new_continued_and_a_suspect():
    """An embedding worker's keys take turns (contract.lua.queues.TAKE): every attempt's
    record carries the key that sent the job, whichever way it was queued."""
    servers = FakePair().sync()
    spec = {"id": "a", "model": MODEL, "kind": "embed"}
    queueing.enqueue(servers, spec, 0, RECOVERY, owner="key:a")
    queueing.enqueue(servers, {**spec, "id": "b"}, 2, RECOVERY, owner="key:b")  # a continuation
    queueing.enqueue(servers, {**spec, "id": "s"}, 3, RECOVERY, suspect=True, group=2, owner="key:s")
    queueing.enqueue(servers, {**spec, "id": "n"}, 0, RECOVERY)  # no keys
    assert owners_waiting(servers.queues) == {
        keys.rq_job_id("a", 0): "key:a",
        keys.rq_job_id("b", 2): "key:b",
        keys.rq_job_id("s", 3): "key:s",
        keys.rq_job_id("n", 0): None,
    }
    front = servers.queues.lindex(keys.rq_queue_key(tiers.queue_name(MODEL, "priority")), 0)
    assert front == keys.rq_job_id("b", 2).encode()
    assert servers.queues.hget(keys.rq_job(keys.rq_job_id("s", 3)), JobField.GROUP) == b"2"


def test_a_requeued_or_rescued_job_keeps_its_owner():
    servers = FakePair().sync()
    record(servers, "running")
    servers.streams.hset(keys.job("running"), JobField.OWNER, "key:a")
    servers.queues.lpop(keys.queue_key(MODEL))
    link = Link(servers.queues, "w1", RECOVERY, streams_client=servers.streams)
    attempt = Claims(link, 3000).claim("running", "d")
    assert queueing.abandon(servers, "running", attempt.epoch, RECOVERY, "crash", charge=True).outcome == 1
    assert owners_waiting(servers.queues) == {keys.rq_job_id("running", attempt.epoch + 1): "key:a"}
    record(servers, "pending")
    servers.queues.delete(*keys.queue_keys(MODEL))  # its enqueuer died before the push
    servers.streams.hset(keys.job("pending"), JobField.OWNER, "key:p")
    assert queueing.rescue(servers, "pending", RECOVERY)
    assert owners_waiting(servers.queues) == {keys.rq_job_id("pending", 0): "key:p"}
