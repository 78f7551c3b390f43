"""Putting a job attempt on its model's RQ queue, and taking a job from a dead attempt.

It is the one way both sides do it. The API enqueues a job's first attempt. The API's reaper
(a dead worker) and a worker handing off at shutdown both call `abandon`. It fences the attempt
out and enqueues the continuation. `purge` deletes a job on request. Enqueueing always uses
RQ's JSON serializer, never pickle. It always enqueues the one job function, with the job's own
spec as the only argument.

A job is pending from its record (or requeue) until `enqueue` has put it on a queue. Its
shard's `keys.pending` holds it meanwhile. Whoever was to enqueue it may die in between. Then
the reaper finds it there and enqueues it (`rescue`). So no job waits for its deadline with
nobody to run it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline as SyncPipeline
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import now

from contract import keys, stats, tiers
from contract.entries import as_text
from contract.lua import jobs, library
from contract.servers import Servers
from contract.settings import Recovery

Pipeline = SyncPipeline | AsyncPipeline
# abandon's reason for a batch line given back to make room
PREEMPT = "preempt"


def enqueue(
    servers: Servers[redis.Redis],
    spec: dict,
    epoch: int,
    recovery: Recovery,
    suspect: bool = False,
    worker: str | None = None,
    deadline_ms: int = 0,
    group: int = 0,
    owner: str = "",
) -> None:
    """Put the attempt after `epoch` of the job `spec` describes on its model's queue for it.

    The queue is contract.tiers.attempt_queue_name's. This also wakes an idle worker, and ends
    the job's pending state. A continuation (epoch > 0) goes to the front. Its client is
    mid-stream and its resume has a deadline (RESUME_WAIT_SECONDS). New jobs behind it have not
    started. A new job routed to `worker` (api/jobs/routing.py) goes on that worker's routed
    queue of its tier. Its entry in `keys.routed` (due at `deadline_ms`) is written in the same
    transaction. So the reaper can always move it back. The enqueue then wakes that worker. Its
    RQ record names the shared queue, where it goes back if not taken in time. RQ's own list
    of queues never holds a worker's. A suspect's record carries its `group`: the most
    suspects it may step with (0 for any). Any record carries its `owner`: the key's hash, since
    an embedding worker's keys take turns. Both are written with the push, for TAKE. A record
    without a group steps alone."""
    model, job_id = spec["model"], spec["id"]
    priority = spec.get("priority", "default")
    name = tiers.attempt_queue_name(model, priority, continuation=epoch > 0, suspect=suspect)
    client = servers.queues
    queue = Queue(name, connection=client, serializer=JSONSerializer)
    job = dict(
        func=keys.JOB_FUNCTION,
        args=(spec,),
        job_id=keys.rq_job_id(job_id, epoch),
        timeout=recovery.job_timeout_s,
        ttl=recovery.job_ttl_s,
        # the completion lives in the job's stream; RQ need not keep a copy
        result_ttl=0,
        failure_ttl=recovery.retention_s,
        description=f"completion {job_id}",
    )
    marks = {keys.JobField.GROUP: group} if suspect else {}
    if owner:
        marks[keys.JobField.OWNER] = owner
    if worker is None:
        record = queue.create_job(**job)
        # MULTI: no TAKE sees it without its group and owner
        with client.pipeline() as pipe:
            queue.enqueue_job(record, pipeline=pipe, at_front=epoch > 0 and not suspect)
            if marks:
                pipe.hset(record.key, mapping=marks)
            pipe.execute()
        wake = keys.wake(model)
    else:
        record = queue.create_job(**job)
        record.origin = queue.name
        record.enqueued_at = now()
        # MULTI: the record, the push, the deadline, or none
        with client.pipeline() as pipe:
            record.save(pipeline=pipe)
            # the record's expiry, as RQ's enqueue sets it
            record.cleanup(ttl=record.ttl, pipeline=pipe)
            if marks:
                pipe.hset(record.key, mapping=marks)
            pipe.rpush(keys.rq_queue_key(tiers.routed_queue_name(model, priority, worker)), record.id)
            pipe.zadd(keys.routed(model), {tiers.routed_member(record.id, worker, priority): deadline_ms})
            pipe.hincrby(keys.STATS, stats.StatField.routed(model), 1)
            pipe.execute()
        wake = keys.wake_worker(worker)
    pending = keys.pending(keys.shard(job_id))
    with client.pipeline(transaction=False) as pipe:
        pipe.lpush(wake, 1)
        # tokens only wake idle workers: a few suffice
        pipe.ltrim(wake, 0, 63)
        pipe.expire(wake, 60)
        # its place is taken now
        pipe.zrem(keys.reserved(model), job_id)
        # one server: the same round trip (a new job's first token waits on it)
        if not servers.split:
            pipe.zrem(pending, job_id)
        pipe.execute()
    if servers.split:
        servers.streams.zrem(pending, job_id)


def routed_taken(client: redis.Redis, model: str, rq_job_id: str, worker: str, priority: str) -> None:
    """`worker` took a job routed to it from its routed queue.

    The job no longer waits, and queue depths stop counting it: its `keys.routed` entry goes.
    If this is lost, the reaper drops the entry at its deadline, finding the job taken."""
    client.zrem(keys.routed(model), tiers.routed_member(rq_job_id, worker, priority))


@dataclass(frozen=True)
class Abandonment:
    """What `abandon` did.

    `outcome` is 1 requeued, 2 ended (worker_lost), or 0 nothing to do (that attempt is not
    current). `suspect` says whether the continuation waits as a suspect. `group` is the most
    suspects it may step with (0 for any). `charged` says whether the death was charged to it."""

    outcome: int
    suspect: bool = False
    charged: bool = False
    group: int = 0


def abandon(
    servers: Servers[redis.Redis],
    job_id: str,
    epoch: int,
    recovery: Recovery,
    reason: str,
    *,
    charge: bool,
    suspect_after: int = 0,
    group: int = 0,
) -> Abandonment:
    """Take the job from attempt `epoch` (dead, hung, leaving, or preempted).

    It requeues the job as a continuation. Or it ends the job with worker_lost once its charged
    deaths or its requeues standing still are used up. A preemption is not counted. STATS
    counts a requeue under `reason` ("crash", "handoff" or "preempt"). A job whose attempt went
    SUSPECT_TOKENS on is cleared of its charges and suspicion. One that stood still is charged
    if `charge`. It becomes a suspect at its `suspect_after`-th such death in a row. With 0,
    the death is not counted as its own. A suspect that died in a `group` of suspects may step
    with half as many after (contract.lua.jobs.ABANDON)."""
    outcome, is_suspect, charged, cap = servers.streams.register_script(jobs.ABANDON)(
        keys=library.job_keys(job_id),
        args=jobs.abandon_args(
            job_id,
            epoch,
            charge=charge,
            suspect_after=suspect_after,
            recovery=recovery,
            counted=reason != PREEMPT,
            group=group,
        ),
    )
    if outcome == 1:
        raw, owner = servers.streams.hmget(keys.job(job_id), [keys.JobField.SPEC, keys.JobField.OWNER])
        if raw is not None:
            spec, who = json.loads(raw), as_text(owner or b"")
            enqueue(servers, spec, epoch + 1, recovery, suspect=bool(is_suspect), group=int(cap), owner=who)
        servers.queues.hincrby(keys.STATS, stats.StatField.requeued(reason), 1)
    elif outcome == 2:
        servers.queues.hincrby(keys.STATS, stats.StatField.LOST, 1)
    return Abandonment(int(outcome), bool(is_suspect), bool(charged), int(cap))


def rescue(servers: Servers[redis.Redis], job_id: str, recovery: Recovery) -> bool:
    """Enqueue a job left pending by an enqueuer that died.

    Returns True if it was queued. A job that has since started or ended only leaves the
    pending index."""
    field = keys.JobField
    status, epoch, suspect, raw, group, owner = servers.streams.hmget(
        keys.job(job_id), [field.STATUS, field.EPOCH, field.SUSPECT, field.SPEC, field.GROUP, field.OWNER]
    )
    if status is None or as_text(status) != keys.JobStatus.QUEUED or raw is None:
        servers.streams.zrem(keys.pending(keys.shard(job_id)), job_id)
        return False
    spec = json.loads(raw)
    enqueue(
        servers,
        spec,
        int(epoch or 0),
        recovery,
        suspect=suspect == b"1",
        group=int(group or 0),
        owner=as_text(owner or b""),
    )
    return True


def purge(servers: Servers[redis.Redis], job_id: str) -> None:
    """Delete every trace of a job.

    That is its keys, and RQ's records and queue entries of each of its attempts. A running
    attempt is fenced out by the missing job hash at its next write or beat."""
    streams = servers.streams
    model, epoch = streams.hmget(keys.job(job_id), [keys.JobField.MODEL, keys.JobField.EPOCH])
    shard = keys.shard(job_id)
    # one shard: one slot
    with streams.pipeline(transaction=True) as pipe:
        pipe.delete(keys.job(job_id), keys.events(job_id), keys.alive(job_id))
        pipe.zrem(keys.running(shard), job_id)
        pipe.zrem(keys.pending(shard), job_id)
        pipe.execute()
    with servers.queues.pipeline(transaction=True) as pipe:
        drop_rq_records(pipe, job_id, as_text(model) if model else None, range(int(epoch or 0) + 2))
        pipe.execute()


def drop_rq_records(pipe: Pipeline, job_id: str, model: str | None, epochs: Iterable[int]) -> None:
    """Add to `pipe` (sync or asyncio) the deletion of RQ's records of the job's attempts at `epochs`.

    It deletes their queue entries too, by key: a queue entry is never parsed here. A record
    holds the whole request. So a job that ended while still queued (cancelled, or past its
    deadline) drops its queued attempt's record at once. It does not keep the record for
    JOB_TTL_SECONDS. A worker that takes the id afterwards finds nothing and skips it."""
    ids = [keys.rq_job_id(job_id, n) for n in epochs]
    pipe.delete(*(keys.rq_job(rq_job_id) for rq_job_id in ids))
    for queue in keys.queue_keys(model) if model else []:
        for rq_job_id in ids:
            pipe.lrem(queue, 0, rq_job_id)
