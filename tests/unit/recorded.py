"""A job as the API records it, waiting for a worker: what the unit tests of the job-stream
scripts and of the worker's attempts claim and write to (on fakeredis with real Lua)."""

from __future__ import annotations

import redis

from contract import keys
from contract.keys import JobField, JobStatus

DIGEST = "digest-of-the-spec"  # what the API records (contract.jobspec.digest)


def record_queued(r: redis.Redis, job_id: str) -> None:
    """The job's hash as RECORD leaves it, with only what CLAIM reads."""
    r.hset(
        keys.job(job_id),
        mapping={JobField.STATUS: JobStatus.QUEUED, JobField.EPOCH: 0, JobField.DIGEST: DIGEST},
    )
