"""The rules of one attempt at one job. It checks and claims the job, and reads back what earlier
attempts published. It waits until the replicas hold the claim. Then it generates, publishes, and
ends the job or hands it off. The runner (worker/attempts/runner.py) keeps the slots attempts run in.

An attempt may be a continuation. Earlier attempts, on a worker that died, hung or shut down,
published text with its token ids. The new one appends exactly those ids to the prompt. It generates
only what is missing, within the original max_tokens. The result is one continuous stream.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import redis
from redis.exceptions import OutOfMemoryError

from contract import errors, keys, queueing, tiers
from contract.entries import CANCELLED, LENGTH, STOP, TOOL_CALLS
from contract.jobspec import InvalidSpec, JobSpec, digest
from contract.keys import JobStatus
from contract.lifecycle import attempt as life
from contract.stats import BatchCounters
from worker.attempts import embedding, tracing
from worker.attempts.attempt import Attempt, Claims, Fenced, JobGone, NotRecorded, RolledBack
from worker.attempts.budget import bounded
from worker.attempts.durability import Durability
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.publisher import Publisher
from worker.attempts.sender import Sender
from worker.engine.protocol import Engine, Generation
from worker.errors import GrammarDeadEnd, PromptRejected
from worker.redis.link import Link
from worker.redis.retrying import TRANSIENT
from worker.text.textstream import TextAssembler

log = logging.getLogger(__name__)

# how long an attempt waits for a replica to hold its claim (`_settle_claim`)
CLAIM_CONFIRM_S = 5.0
# each WAIT of that
CLAIM_WAIT_MS = 250
FULL_MESSAGE = "The server's storage is full: this answer could not be stored. Try again shortly."


class Outcome(StrEnum):
    """How a job function call or an attempt ended. It is logged, since RQ keeps no result.
    Those that are attempt states take their word from contract/lifecycle/attempt.py."""

    # claimed: the attempt runs on its own thread
    STARTED = life.CLAIMED.outcome
    # ended, cancelled or late before it started
    SKIPPED = "skipped"
    # not a job the API recorded (a planted or malformed spec): not run
    REFUSED = "refused"
    # a job for another model: ended with model_not_found
    WRONG_MODEL = "wrong-model"
    STOP = STOP
    LENGTH = LENGTH
    CANCELLED = CANCELLED
    TOOL_CALLS = TOOL_CALLS
    # the prompt cannot run here (too long, no chat template)
    REJECTED = "rejected"
    DEADLINE = "deadline_exceeded"
    # another attempt took over
    FENCED = life.FENCED.outcome
    # Redis refused its entries for memory: ended so, not requeued
    STORAGE_FULL = "storage_full"
    # given back at shutdown
    HANDED_OFF = life.HANDED_OFF.outcome


@dataclass(frozen=True)
class JobAttempt:
    """A job this worker claimed: its spec, and the attempt at it."""

    spec: JobSpec
    attempt: Attempt


class HandedOff(Exception): ...


class AttemptRules:
    """The one implementation of the stream contract, for every attempt the runner starts."""

    def __init__(
        self,
        engine: Engine,
        link: Link,
        claims: Claims,
        publisher: Publisher,
        heartbeat: Heartbeat,
        durability: Durability | None,
        counters: BatchCounters,
        log_content: bool,
        suspect_cleared: Callable[[Attempt], None],
    ) -> None:
        self.engine, self.link, self.claims, self.publisher = engine, link, claims, publisher
        self.heartbeat, self.durability, self.counters = heartbeat, durability, counters
        # LOG_CONTENT: prompts and completions in the log
        self._log_content = log_content
        # the runner's count of running suspects
        self._suspect_cleared = suspect_cleared
        # SIGTERM: attempts past it hand their jobs off
        self.shutdown_at: float | None = None

    def claim(self, raw_spec: dict, rq_job_id: str) -> JobAttempt | Outcome:
        """Check the job and claim it, or say why it does not run here. Only a spec the API
        recorded for the job that the RQ job id names is run."""
        try:
            spec = JobSpec.from_dict(raw_spec)
        except InvalidSpec as exc:
            log.warning("refused job %s: invalid arguments: %s", rq_job_id, exc)
            return Outcome.REFUSED
        if spec.id != keys.job_of(rq_job_id):
            log.warning("refused job %s: it carries the spec of %s", rq_job_id, spec.id)
            return Outcome.REFUSED
        model, kind = tiers.served_model(self.engine.model_name)
        if spec.model != self.engine.model_name or spec.kind not in tiers.JOB_KINDS[kind]:
            self.claims.end(spec.id, errors.MODEL_NOT_FOUND.entry(f"This worker serves {model}'s {kind}."))
            return Outcome.WRONG_MODEL
        try:
            attempt = self.claims.claim(spec.id, digest(raw_spec))
        except JobGone:
            return Outcome.SKIPPED
        except NotRecorded:
            log.warning("refused job %s: not the spec the API recorded", rq_job_id)
            return Outcome.REFUSED
        except TRANSIENT:
            # Redis away for long: the job stays with the caller until it is back
            raise
        except redis.RedisError as exc:
            # The job cannot start here (e.g. refused by an ACL): end it rather than leave
            # its client waiting for the queue deadline.
            log.exception("could not claim %s", spec.id)
            with contextlib.suppress(redis.RedisError):
                self.claims.end(
                    spec.id,
                    errors.WORKER_ERROR.entry(f"The worker could not start the job: {type(exc).__name__}"),
                    only_if_status=JobStatus.QUEUED,
                )
            raise
        return JobAttempt(spec, attempt)

    def run(self, spec: JobSpec, attempt: Attempt) -> Outcome:
        """Run the claimed attempt to its end: finished, failed, fenced or handed off."""
        self.heartbeat.track(attempt)
        if self.durability is not None:
            self.durability.track(attempt)
        try:
            return self._generate(spec, attempt)
        except Fenced as exc:
            log.warning("attempt fenced out, abandoning job: %s", exc)
            return Outcome.FENCED
        # the job goes on from what the stream holds (docs/protocol.md)
        except RolledBack as exc:
            log.error("%s; handing the job off", exc)
            self._hand_off(attempt)
            return Outcome.HANDED_OFF
        except HandedOff:
            return Outcome.HANDED_OFF
        except OutOfMemoryError as exc:
            self._end_full(attempt, exc)
            return Outcome.STORAGE_FULL
        # cold shutdown: give the job back first
        except (SystemExit, KeyboardInterrupt):
            self._hand_off(attempt)
            raise
        except Exception as exc:
            log.exception("generation failed for %s", spec.id)
            with contextlib.suppress(Fenced, redis.RedisError):
                self.publisher.failed(
                    attempt, errors.WORKER_ERROR, f"The worker failed: {type(exc).__name__}"
                )
            raise
        finally:
            self.heartbeat.untrack(attempt)
            self.publisher.count_tokens(spec.model, attempt)

    def _generate(self, spec: JobSpec, attempt: Attempt) -> Outcome:
        engine, pub = self.engine, self.publisher
        # an embedding or rerank worker's (an Embedder)
        if spec.kind in ("embed", "rank"):
            shutdown = lambda: self.shutdown_at  # noqa: E731
            ended = embedding.run(engine, self.claims, pub, self._settle_claim, spec, attempt, shutdown)  # type: ignore[arg-type]
            if ended in (embedding.HAND_OFF, queueing.PREEMPT):
                self._hand_off(attempt, ended)
                raise HandedOff()
            return Outcome(ended)
        progress = self.claims.progress(spec.id)
        attempt.saw(progress.last_id)
        prior = list(progress.token_ids)
        try:
            # its context edit applied (worker/tools/clearing.py)
            spec, cleared = engine.edited(spec)
            prompt = engine.prompt_ids(spec)
            attempt.trace.prompted()
        except PromptRejected as exc:
            pub.failed(attempt, exc.error, str(exc), exc.param)
            return Outcome.REJECTED
        prompt_tokens = progress.prompt_tokens or len(prompt)
        self._settle_claim(attempt)
        pub.started(attempt, prompt_tokens, after=progress.last_id, cleared=cleared)
        attempt.move("start")
        generated = attempt.prior = len(prior)
        if prior:
            log.info("resuming %s after %d tokens (attempt epoch %d)", spec.id, generated, attempt.epoch)
        context = prompt + prior
        attempt.trace.reading(len(prompt), len(prior), progress.epoch)
        reply = engine.reply(spec, prompt)
        # goes on where they were
        out = Sender(engine.piece, pub, attempt, reply, spec.logprobs, prior)
        thought = out.reasoning_tokens
        if attempt.cancelled:
            pub.finished(attempt, CANCELLED, prompt_tokens, generated, reasoning_tokens=thought())
            return Outcome.CANCELLED
        if (spec.max_tokens is not None and generated >= spec.max_tokens) or len(context) >= engine.n_ctx:
            pub.finished(attempt, LENGTH, prompt_tokens, generated, reasoning_tokens=thought())
            return Outcome.LENGTH

        assembler = TextAssembler(spec.stop)
        # the context window filled up
        reason = LENGTH

        # a step read part of the prompt: not a hung native call
        def progressed() -> None:
            attempt.progress_at = time.monotonic()

        # prompt tokens the slot's cache held (the usage's cached_tokens)
        reused = 0

        # the engine's end of the job: its slot's cache held these
        def cached(tokens: int) -> None:
            nonlocal reused
            reused = min(tokens, len(prompt))

        job = Generation(
            spec,
            prompt,
            prior,
            alone_for=self.link.recovery.suspect_tokens if attempt.suspect else 0,
            since_ms=progress.moved_ms if attempt.resumed else 0,
            progress=progressed,
            cached=cached,
        )
        picks = bounded(engine, job, out)
        try:
            for pick, piece in tracing.observed(picks, self.counters, attempt.trace.first_token):
                token = pick.token
                attempt.progress_at = time.monotonic()
                attempt.generated += 1
                if progress.deadline_ms is not None and time.time() * 1000 > progress.deadline_ms:
                    out.send(assembler.flush())
                    out.end()
                    pub.failed(attempt, errors.DEADLINE)
                    return Outcome.DEADLINE
                attempt.check()
                if self.shutdown_at is not None and time.monotonic() >= self.shutdown_at:
                    self._hand_off(attempt)
                    raise HandedOff()
                if engine.is_end(token):
                    reason = STOP
                    break
                generated += 1
                if attempt.suspect and attempt.generated >= self.link.recovery.suspect_tokens:
                    self._clear_suspect(attempt)
                out.picked(pick, piece)
                out.send(assembler.push(token, piece))
                if assembler.stopped:
                    reason = STOP
                    break
                if attempt.cancelled:
                    reason = CANCELLED
                    break
                if spec.max_tokens is not None and generated >= spec.max_tokens:
                    reason = LENGTH
                    break
                # after the checks above: a line that just ended is not given back
                if attempt.preempted:
                    self._hand_off(attempt, queueing.PREEMPT)
                    raise HandedOff()
        # the job's own grammar cannot go on: say so, end it
        except GrammarDeadEnd as exc:
            out.send(assembler.flush())
            out.end()
            pub.failed(attempt, errors.INVALID_REQUEST, f"The output cannot continue its grammar: {exc}")
            return Outcome.REJECTED
        # the engine's end of the job first: what its slot holds is written for routing
        finally:
            picks.close()
        out.send(assembler.flush())
        out.end()
        if reason == STOP and reply.calls:
            reason = TOOL_CALLS
        matched = assembler.matched if reason == STOP else ""
        pub.finished(
            attempt,
            reason,
            prompt_tokens,
            generated,
            reused,
            reasoning_tokens=thought(),
            stop_sequence=matched,
        )
        # opt-in, for debugging only: the log then holds user data
        if self._log_content:
            prompt_text = [m.content for m in spec.messages] if spec.kind == "chat" else spec.prompt
            log.warning("LOG_CONTENT prompt=%r completion (this attempt)=%r", prompt_text, out.said())
        return Outcome(reason)

    def _end_full(self, attempt: Attempt, exc: OutOfMemoryError) -> None:
        """Redis refused the attempt's entries for memory (maxmemory, noeviction). An embed
        job's vectors may be megabytes. End the job with `storage_full`, a small entry a full
        Redis still takes (FAIL). Left running, the reaper would requeue it, to be done and
        refused again, time after time."""
        log.error("%s: Redis is full (%s); ending the job with storage_full", attempt.job_id, exc)
        entry = errors.STORAGE_FULL.entry(FULL_MESSAGE, epoch=attempt.epoch)
        try:
            if not self.claims.fail(attempt, entry):
                log.warning("%s: no longer this attempt's job; left as it is", attempt.job_id)
        # the reaper finds the attempt dead instead
        except redis.RedisError as error:
            log.error("%s: could not end the job either: %s", attempt.job_id, error)

    def _settle_claim(self, attempt: Attempt) -> None:
        """Before the attempt writes anything a client could be sent, wait for the replicas to hold
        its claim. These are the replicas a failover could promote (worker/attempts/durability.py).
        A primary the sentinels have just replaced takes writes until they say so (about a second).
        A job claimed there alone would run beside the attempt another worker starts on the new
        primary. Clients sent the first's text from the old one would then be sent the second's. A
        claim the new primary lacks is made again there (an empty APPEND). Of two attempts, the one
        that claims first runs. The other is fenced having written nothing. Without an answer in
        CLAIM_CONFIRM_S, the attempt runs anyway, as the API answers for a new job anyway. This is
        for a replica away while its primary is still the primary. Through Sentinel, the sentinels
        still say so."""
        durability = self.durability
        if durability is None or not durability.replicas_expected(attempt.job_id):
            return
        deadline = time.monotonic() + CLAIM_CONFIRM_S
        while True:
            replicas = max(durability.replicas_expected(attempt.job_id), 1)
            # then ask the sentinels before running anyway
            late = time.monotonic() >= deadline
            current, acked, primary = self.claims.replicated(attempt, replicas, CLAIM_WAIT_MS, late)
            if current == 0:
                attempt.move("fence")
                attempt.check()
            # replaced while its connection still reached it: its acks say nothing
            if not primary:
                log.warning("%s: the sentinels have named a new primary; claiming there", attempt.job_id)
            elif current == 2:
                log.warning(
                    "%s: the new primary lacks attempt %d's claim; claiming",
                    attempt.job_id,
                    attempt.epoch,
                )
                self.publisher.resend(attempt)
            elif acked >= replicas:
                return
            elif late:
                log.warning(
                    "no replica acknowledged the claim of %s in %.0fs: running it anyway",
                    attempt.job_id,
                    CLAIM_CONFIRM_S,
                )
                return

    def _clear_suspect(self, attempt: Attempt) -> None:
        """A suspect that went on past where its batch died is cleared. A job that kills
        workers where it stands would have died again. The worker may then take the next
        suspect. So a dead batch's jobs are read again side by side, not one after another."""
        # False: no longer the job's attempt
        cleared = self.claims.clear_suspect(attempt)
        # either way not asked again at every token: its next write is fenced
        self._suspect_cleared(attempt)
        if cleared:
            log.info("%s is no longer a suspect (%d tokens on)", attempt.job_id, attempt.generated)

    def _hand_off(self, attempt: Attempt, reason: str = "handoff") -> None:
        """Give the job back (shutting down, or preempted). A continuation is enqueued for
        another worker. What this attempt generated is written first, so the continuation
        need not redo it."""
        with contextlib.suppress(Fenced, RolledBack, redis.RedisError):
            self.publisher.flush(attempt)
        attempt.move("hand off")
        try:
            link = self.link
            outcome = queueing.abandon(
                link.servers, attempt.job_id, attempt.epoch, link.recovery, reason, charge=False
            ).outcome
            level = logging.INFO if reason == queueing.PREEMPT else logging.WARNING
            log.log(level, "handed off %s (%s, outcome %d)", attempt.job_id, reason, outcome)
        # the reaper will find the attempt dead instead
        except redis.RedisError as exc:
            log.warning("could not hand off %s: %s", attempt.job_id, exc)
