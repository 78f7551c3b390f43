"""The job function RQ runs: one attempt at one completion, published to its stream.

RQ calls `generate(spec)` by its dotted path (`contract.keys.JOB_FUNCTION`). The loaded
model cannot travel through RQ's JSON arguments, so the worker process installs its
`JobRunner` here once at start (`install`); the function is unusable anywhere else. It
claims the job and returns: the attempt runs on its own thread, in one of the worker's
slots, while the engine decodes it together with the others.

An attempt may be a continuation: earlier attempts of the same job (on a worker that died,
hung or shut down) already published text with its token ids. The new attempt rebuilds the
prompt, appends exactly those ids, and generates only what is missing, within the job's
original max_tokens; the client sees one continuous stream.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Protocol

import redis
from rq import get_current_job

from contract import logs, queueing
from contract.entries import Failed
from contract.jobspec import InvalidSpec, JobSpec
from contract.keys import BatchCounters, JobStatus
from contract.queueing import Recovery
from worker.errors import PromptRejected
from worker.heartbeat import Heartbeat
from worker.publisher import Attempt, Fenced, JobGone, Publisher
from worker.textstream import TextAssembler

log = logging.getLogger("tokenspool.worker")


class Engine(Protocol):
    model_name: str
    n_ctx: int

    def prompt_ids(self, spec: JobSpec) -> list[int]: ...
    def is_end(self, token: int) -> bool: ...
    def tokens(self, spec: JobSpec, prompt: list[int], prior: list[int]): ...
    def counters(self) -> BatchCounters: ...


class HandedOff(Exception):
    pass


class JobRunner:
    """Runs attempts, up to `slots` at once: RQ's loop reserves a slot before it takes a
    job from the queue (`reserve`), `start` claims the job and runs it on its own thread,
    and the slot is free again when that attempt ends. The engine decodes the running
    attempts together; this class is the one implementation of the stream contract for
    all of them."""

    def __init__(
        self,
        engine: Engine,
        publisher: Publisher,
        heartbeat: Heartbeat,
        client: redis.Redis,
        recovery: Recovery,
        shutdown_grace_s: float = 20.0,
        log_content: bool = False,
        slots: int = 1,
    ) -> None:
        self.engine = engine
        self.publisher = publisher
        self.heartbeat = heartbeat
        self._client = client
        self.recovery = recovery
        self._shutdown_grace = shutdown_grace_s
        self._shutdown_at: float | None = None
        self._log_content = log_content  # LOG_CONTENT: prompts and completions in the log
        self._free = threading.BoundedSemaphore(slots)
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._last_end = time.monotonic()  # when the last attempt ended (or the start)

    def request_shutdown(self, grace_s: float | None = None) -> None:
        """SIGTERM: finish the running jobs if they end within the grace period, else hand
        them off (a second signal: hand them off now)."""
        at = time.monotonic() + (self._shutdown_grace if grace_s is None else grace_s)
        if self._shutdown_at is None or at < self._shutdown_at:
            self._shutdown_at = at

    def reserve(self, timeout: float) -> bool:
        """Wait up to `timeout` for a free slot; the caller then takes one job and `start`s it."""
        return self._free.acquire(timeout=timeout)

    def unreserve(self) -> None:
        self._free.release()

    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def idle_for(self) -> float:
        """Seconds since the last attempt ended; 0 while any runs."""
        with self._lock:
            return 0.0 if self._threads else time.monotonic() - self._last_end

    def drain(self, timeout: float | None = None) -> None:
        """Wait for the running attempts to end (finish or hand off)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._threads)
            if not threads:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            threads[0].join(timeout=left)

    def run(self, raw_spec: object) -> str:
        """Run one attempt to its end on this thread; returns its outcome."""
        with _logged_as(raw_spec):
            ready = self._prepare(raw_spec)
            return ready if isinstance(ready, str) else self._attempt(*ready)

    def start(self, raw_spec: object) -> str:
        """Claim the job and run the attempt on its own thread, in the slot the caller
        reserved; returns at once (RQ's record of the job ends here, the job's own
        record lives on in Redis with its heartbeat)."""
        try:
            with _logged_as(raw_spec):
                ready = self._prepare(raw_spec)
        except BaseException:
            self._free.release()
            raise
        if isinstance(ready, str):
            self._free.release()
            return ready
        spec, attempt = ready
        thread = threading.Thread(
            target=self._in_thread, args=(spec, attempt), name=f"job-{spec.id}", daemon=True
        )
        with self._lock:
            self._threads.add(thread)
        thread.start()
        return "started"

    def _in_thread(self, spec: JobSpec, attempt: Attempt) -> None:
        logs.set_completion(spec.id)
        try:
            outcome = self._attempt(spec, attempt)
            log.info("%s: %s", spec.id, outcome)
        except Exception:
            pass  # logged and reported to the client by _attempt
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
                self._last_end = time.monotonic()
            self._free.release()

    def _prepare(self, raw_spec: object) -> tuple[JobSpec, Attempt] | str:
        """Check the job and claim it: the spec and the new attempt, or why not."""
        job = get_current_job()
        try:
            spec = JobSpec.from_dict(raw_spec)
        except InvalidSpec as exc:
            if job is not None:
                self.publisher.end(
                    job.id,
                    Failed(0, f"Invalid job arguments: {exc}", "invalid_request_error", "invalid_request"),
                )
            raise
        if spec.model != self.engine.model_name:
            self.publisher.end(
                spec.id,
                Failed(
                    0,
                    f"This worker serves {self.engine.model_name}.",
                    "invalid_request_error",
                    "model_not_found",
                ),
            )
            return "wrong-model"
        try:
            attempt = self.publisher.claim(spec.id)
        except JobGone:
            return "skipped"  # ended or cancelled before it started, or past its deadline
        except redis.RedisError as exc:
            # The job cannot start here (e.g. refused by an ACL): end it rather than leave
            # its client waiting for the queue deadline.
            log.exception("could not claim %s", spec.id)
            with contextlib.suppress(redis.RedisError):
                self.publisher.end(
                    spec.id,
                    Failed(
                        0,
                        f"The worker could not start the job: {type(exc).__name__}",
                        "server_error",
                        "worker_error",
                    ),
                    only_if_status=JobStatus.QUEUED,
                )
            raise
        return spec, attempt

    def _attempt(self, spec: JobSpec, attempt: Attempt) -> str:
        self.heartbeat.track(attempt)
        try:
            return self._generate(spec, attempt)
        except Fenced as exc:
            log.warning("attempt fenced out, abandoning job: %s", exc)
            return "fenced"
        except HandedOff:
            return "handed-off"
        except (SystemExit, KeyboardInterrupt):  # cold shutdown: give the job back first
            self._hand_off(attempt)
            raise
        except Exception as exc:
            log.exception("generation failed for %s", spec.id)
            with contextlib.suppress(Fenced, redis.RedisError):
                self.publisher.failed(
                    attempt, f"The worker failed: {type(exc).__name__}", "server_error", "worker_error"
                )
            raise
        finally:
            self.heartbeat.untrack(attempt)
            self.publisher.count_tokens(spec.model, attempt)

    def _generate(self, spec: JobSpec, attempt: Attempt) -> str:
        engine, pub = self.engine, self.publisher
        progress = pub.progress(spec.id)
        prior = list(progress.token_ids)
        try:
            prompt = engine.prompt_ids(spec)
        except PromptRejected as exc:
            pub.failed(attempt, str(exc), "invalid_request_error", exc.code, exc.param)
            return exc.code
        prompt_tokens = progress.prompt_tokens or len(prompt)
        pub.started(attempt, prompt_tokens)
        generated = len(prior)
        if prior:
            log.info("resuming %s after %d tokens (attempt epoch %d)", spec.id, generated, attempt.epoch)
        context = prompt + prior
        if attempt.cancelled or (spec.max_tokens is not None and generated >= spec.max_tokens):
            pub.finished(attempt, "stop" if attempt.cancelled else "length", prompt_tokens, generated)
            return "cancelled" if attempt.cancelled else "length"
        if len(context) >= engine.n_ctx:
            pub.finished(attempt, "length", prompt_tokens, generated)
            return "length"

        assembler = TextAssembler(spec.stop)
        said: list[str] = []  # this attempt's text (logged only with LOG_CONTENT)
        reason = "length"  # the context window filled up
        for token, piece in engine.tokens(spec, prompt, prior):
            attempt.progress_at = time.monotonic()
            if progress.deadline_ms is not None and time.time() * 1000 > progress.deadline_ms:
                tail = assembler.flush()
                if tail is not None:
                    pub.delta(attempt, tail.text, tail.token_ids)
                pub.failed(
                    attempt,
                    "The completion did not finish within the server's time limit.",
                    "server_error",
                    "deadline_exceeded",
                )
                return "deadline_exceeded"
            if attempt.fenced:
                raise Fenced(f"{spec.id} epoch {attempt.epoch}: another attempt took over")
            if self._shutdown_at is not None and time.monotonic() >= self._shutdown_at:
                self._hand_off(attempt)
                raise HandedOff()
            if engine.is_end(token):
                reason = "stop"
                break
            generated += 1
            out = assembler.push(token, piece)
            if out is not None:
                pub.delta(attempt, out.text, out.token_ids)
                said.append(out.text)
            if assembler.stopped or attempt.cancelled:
                reason = "stop"
                break
            if spec.max_tokens is not None and generated >= spec.max_tokens:
                reason = "length"
                break
        tail = assembler.flush()
        if tail is not None:
            pub.delta(attempt, tail.text, tail.token_ids)
            said.append(tail.text)
        pub.finished(attempt, reason, prompt_tokens, generated)
        if self._log_content:  # opt-in, for debugging only: the log then holds user data
            prompt = [m.content for m in spec.messages] if spec.kind == "chat" else spec.prompt
            log.warning("LOG_CONTENT prompt=%r completion (this attempt)=%r", prompt, "".join(said))
        return "cancelled" if attempt.cancelled else reason

    def _hand_off(self, attempt: Attempt) -> None:
        """Give the job back; a continuation is enqueued for another worker. What this
        attempt generated is written first, so the continuation need not redo it."""
        with contextlib.suppress(Fenced, redis.RedisError):
            self.publisher.flush(attempt)
        try:
            outcome = queueing.abandon(
                self._client, attempt.completion_id, attempt.epoch, self.recovery, "handoff"
            )
            log.warning("handed off %s (outcome %d)", attempt.completion_id, outcome)
        except redis.RedisError as exc:  # the reaper will find the attempt dead instead
            log.warning("could not hand off %s: %s", attempt.completion_id, exc)


@contextlib.contextmanager
def _logged_as(raw_spec: object):
    """What is logged meanwhile carries the job's completion id."""
    job = get_current_job()
    claimed = raw_spec.get("id") if isinstance(raw_spec, dict) else None
    logs.set_completion(str(claimed or (job.id if job else "")))
    try:
        yield
    finally:
        logs.set_completion("")


_runner: JobRunner | None = None


def install(runner: JobRunner) -> None:
    global _runner
    _runner = runner


def runner() -> JobRunner:
    if _runner is None:
        raise RuntimeError("worker.jobs runs only inside a tokenspool worker")
    return _runner


def generate(spec: dict) -> str:
    """RQ's job function: start the attempt in a slot the worker reserved."""
    return runner().start(spec)
