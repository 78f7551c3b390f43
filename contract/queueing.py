"""Putting a job attempt on its model's RQ queue, and taking a job from a dead attempt:
the one way both sides do it.

The API enqueues a job's first attempt; the API's reaper (a dead worker) and a worker
handing off at shutdown both call `abandon`, which fences the attempt out and enqueues the
continuation; `purge` deletes a job on request. Always RQ's JSON serializer (never
pickle), always the one job function, and the job's own spec as the only argument.
"""

from __future__ import annotations

import contextlib
import json

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer

from contract import keys, scripts
from contract.settings import Recovery


def enqueue(client: redis.Redis, spec: dict, job_id: str, recovery: Recovery) -> None:
    queue = Queue(keys.queue_name(spec["model"]), connection=client, serializer=JSONSerializer)
    queue.enqueue_call(
        func=keys.JOB_FUNCTION,
        args=(spec,),
        job_id=job_id,
        timeout=recovery.job_timeout_s,
        ttl=recovery.job_ttl_s,
        result_ttl=0,  # the completion lives in the job's stream; RQ need not keep a copy
        failure_ttl=recovery.retention_s,
        description=f"completion {spec['id']}",
    )


def abandon(client: redis.Redis, completion_id: str, epoch: int, recovery: Recovery, reason: str) -> int:
    """Take the job from attempt `epoch` (dead, hung, or leaving): requeue it as a
    continuation, or end it with worker_lost once its attempts are used up; counted in
    STATS under `reason` ("crash" or "handoff"). Returns
    ABANDON's code: 1 requeued, 2 ended, 0 nothing to do (that attempt is not current)."""
    outcome = int(
        client.register_script(scripts.ABANDON)(
            keys=scripts.job_keys(completion_id),
            args=scripts.abandon_args(
                completion_id,
                epoch,
                recovery.max_attempts,
                int(recovery.resume_wait_s * 1000),
                recovery.retention_s,
            ),
        )
    )
    if outcome == 1:
        raw = client.hget(keys.job(completion_id), keys.JobField.SPEC)
        if raw is not None:
            job_id = keys.continuation_job_id(completion_id, epoch + 1)
            enqueue(client, json.loads(raw), job_id, recovery)
        client.hincrby(keys.STATS, keys.StatField.requeued(reason), 1)
    elif outcome == 2:
        client.hincrby(keys.STATS, keys.StatField.LOST, 1)
    return outcome


def purge(client: redis.Redis, completion_id: str, attempts: int) -> None:
    """Delete every trace of a job: its keys and RQ's jobs for each of its attempts. A
    running attempt is fenced out by the missing job hash at its next write or beat."""
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.job(completion_id), keys.events(completion_id), keys.alive(completion_id))
        pipe.zrem(keys.RUNNING, completion_id)
        pipe.execute()
    ids = [completion_id] + [keys.continuation_job_id(completion_id, n) for n in range(1, attempts + 2)]
    for job_id in ids:
        with contextlib.suppress(NoSuchJobError, InvalidJobOperation):  # gone meanwhile: fine
            Job.fetch(job_id, connection=client, serializer=JSONSerializer).delete(remove_from_queue=True)
