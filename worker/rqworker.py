"""RQ's SimpleWorker, restricted to tokenspool's own job function.

SimpleWorker runs jobs in this process: no fork per job (CUDA cannot survive a fork) and the
model stays loaded. Jobs are JSON (never pickle), and `AllowlistedJob` refuses to resolve any
function but `contract.keys.JOB_FUNCTION`, so a job planted in Redis with another function
name fails without anything being imported or called.

A worker holds up to SLOTS jobs: it takes a job from the queue only once a slot is free
(`dequeue_job_and_maintain_ttl`), and the job function returns as soon as the attempt is
claimed and running in its slot, so RQ's loop goes back to the queue for the next one.

On SIGTERM RQ stops taking jobs; `TokenspoolWorker` also tells the job runner, which
finishes the running jobs within the shutdown grace period or hands them off.
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
        from worker import runner

        return runner.generate


class TokenspoolWorker(SimpleWorker):
    job_class = AllowlistedJob

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):
        """Wait for a free slot first: jobs stay in the queue (where any worker may take
        them) rather than wait inside a busy process."""
        from worker.runner import runner as installed

        runner = installed()
        while not runner.reserve(timeout=1.0):
            self.heartbeat()
            if self._stop_requested:
                return None
        try:
            while True:
                result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
                # Idle (IDLE_EXIT_SECONDS) means no job for that long, not only no new one.
                if result is not None or max_idle_time is None or runner.idle_for() >= max_idle_time:
                    break
        except BaseException:
            runner.unreserve()
            raise
        if result is None:
            runner.unreserve()
        return result

    def request_stop(self, signum, frame):
        from worker.runner import runner

        runner().request_shutdown()
        super().request_stop(signum, frame)

    def request_force_stop(self, signum, frame):
        """A second signal: hand the running jobs off now (main waits for that)."""
        from worker.runner import runner

        runner().request_shutdown(0.0)
        super().request_force_stop(signum, frame)
