"""The job function RQ runs: one completion, published to its stream.

RQ calls `generate(spec)` by its dotted path (`contract.keys.JOB_FUNCTION`). The loaded
model cannot travel through RQ's JSON arguments, so the worker process installs its
`JobRunner` here once at start (`install`); the function is unusable anywhere else.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

import redis
from rq import get_current_job

from contract import keys, scripts
from contract.entries import Failed
from contract.jobspec import InvalidSpec, JobSpec
from contract.keys import JobStatus
from worker.errors import PromptRejected
from worker.publisher import Attempt, Fenced, JobGone, Publisher
from worker.textstream import TextAssembler

log = logging.getLogger("tokenspool.worker")


class Engine(Protocol):
    model_name: str

    def prompt_ids(self, spec: JobSpec) -> list[int]: ...
    def is_end(self, token: int) -> bool: ...
    def tokens(self, spec: JobSpec, context: list[int]): ...


class JobRunner:
    def __init__(self, engine: Engine, publisher: Publisher, client: redis.Redis, retention_s: int) -> None:
        self.engine = engine
        self.publisher = publisher
        self._end = client.register_script(scripts.END)
        self._retention = retention_s

    def run(self, raw_spec: object) -> str:
        """Run one job; returns its outcome for RQ's records."""
        try:
            spec = JobSpec.from_dict(raw_spec)
        except InvalidSpec as exc:
            job = get_current_job()
            if job is not None:
                self._fail(job.id, "invalid_request", f"Invalid job arguments: {exc}")
            raise
        if spec.model != self.engine.model_name:
            self._fail(spec.id, "model_not_found", f"This worker serves {self.engine.model_name}")
            return "wrong-model"
        try:
            attempt = self.publisher.claim(spec.id)
        except JobGone:
            # ended (or cancelled) before it started, or waited past its queue deadline
            self._fail(
                spec.id,
                "queue_timeout",
                "No worker started this request in time.",
                only_if_status=JobStatus.QUEUED,
            )
            return "skipped"
        try:
            return self._generate(spec, attempt)
        except Fenced as exc:
            log.warning("attempt fenced out, abandoning job: %s", exc)
            return "fenced"
        except Exception as exc:
            log.exception("generation failed for %s", spec.id)
            with contextlib.suppress(Fenced, redis.RedisError):
                self.publisher.failed(
                    attempt, f"The worker failed: {type(exc).__name__}", "server_error", "worker_error"
                )
            raise

    def _generate(self, spec: JobSpec, attempt: Attempt) -> str:
        engine, pub = self.engine, self.publisher
        if attempt.cancelled:
            pub.finished(attempt, "stop", 0, 0)
            return "cancelled"
        try:
            prompt = engine.prompt_ids(spec)
        except PromptRejected as exc:
            pub.failed(attempt, str(exc), "invalid_request_error", exc.code, exc.param)
            return exc.code
        pub.started(attempt, len(prompt))
        assembler = TextAssembler(spec.stop)
        generated = 0
        reason = "length"  # the context window filled up
        for token, piece in engine.tokens(spec, prompt):
            if engine.is_end(token):
                reason = "stop"
                break
            generated += 1
            out = assembler.push(token, piece)
            if out is not None:
                pub.delta(attempt, out.text, out.token_ids)
            if assembler.stopped or attempt.cancelled:
                reason = "stop"
                break
            if spec.max_tokens is not None and generated >= spec.max_tokens:
                reason = "length"
                break
        tail = assembler.flush()
        if tail is not None:
            pub.delta(attempt, tail.text, tail.token_ids)
        pub.finished(attempt, reason, len(prompt), generated)
        return "cancelled" if attempt.cancelled else reason

    def _fail(self, completion_id: str, code: str, message: str, only_if_status: str = "") -> None:
        error = Failed(epoch=0, message=message, type="invalid_request_error", code=code)
        self._end(
            keys=[keys.job(completion_id), keys.events(completion_id)],
            args=scripts.end_args(error, self._retention, only_if_status),
        )


_runner: JobRunner | None = None


def install(runner: JobRunner) -> None:
    global _runner
    _runner = runner


def generate(spec: dict) -> str:
    if _runner is None:
        raise RuntimeError("worker.jobs.generate runs only inside a tokenspool worker")
    return _runner.run(spec)
