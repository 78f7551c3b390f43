"""Putting a job attempt on its model's RQ queue: the one way both sides do it.

The API enqueues a job's first attempt; the API's reaper and a worker handing off at
shutdown enqueue continuations. Always RQ's JSON serializer (never pickle), always the one
job function, and the job's own spec as the only argument.
"""

from __future__ import annotations

import json

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from contract import keys


def enqueue(
    client: redis.Redis,
    spec: dict,
    *,
    job_id: str,
    timeout_s: int,
    ttl_s: int,
    retention_s: int,
) -> None:
    queue = Queue(keys.queue_name(spec["model"]), connection=client, serializer=JSONSerializer)
    queue.enqueue_call(
        func=keys.JOB_FUNCTION,
        args=(spec,),
        job_id=job_id,
        timeout=timeout_s,
        ttl=ttl_s,
        result_ttl=0,  # the completion lives in the job's stream; RQ need not keep a copy
        failure_ttl=retention_s,
        description=f"completion {spec['id']}",
    )


def enqueue_continuation(client: redis.Redis, completion_id: str, attempt: int, **kw) -> bool:
    """Enqueue the next attempt of a job from the spec stored with it; False if it is gone."""

    raw = client.hget(keys.job(completion_id), keys.JobField.SPEC)
    if raw is None:
        return False
    enqueue(client, json.loads(raw), job_id=keys.continuation_job_id(completion_id, attempt), **kw)
    return True
