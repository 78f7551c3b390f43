"""RQ's SimpleWorker, restricted to tokenspool's own job function.

SimpleWorker runs jobs in this process: no fork per job (CUDA cannot survive a fork) and the
model stays loaded. Jobs are JSON (never pickle), and `AllowlistedJob` refuses to resolve any
function but `contract.keys.JOB_FUNCTION`, so a job planted in Redis with another function
name fails without anything being imported or called.

On SIGTERM RQ stops taking jobs after the current one; `TokenspoolWorker` also tells the job
runner, which finishes the job within the shutdown grace period or hands it off.
"""

from __future__ import annotations

from rq.job import Job
from rq.worker import SimpleWorker

from contract.keys import JOB_FUNCTION


class ForbiddenJob(Exception):
    pass


class AllowlistedJob(Job):
    @property
    def func(self):
        if self.func_name != JOB_FUNCTION or self.instance is not None:
            raise ForbiddenJob(f"refusing to run {self.func_name!r}: only {JOB_FUNCTION} is allowed")
        from worker import jobs

        return jobs.generate


class TokenspoolWorker(SimpleWorker):
    job_class = AllowlistedJob

    def request_stop(self, signum, frame):
        from worker import jobs

        if jobs._runner is not None:
            jobs._runner.request_shutdown()
        super().request_stop(signum, frame)
