"""Running a job: one attempt at one completion, published to its stream.

RQ records every job as a call of `generate(spec)` (`contract.keys.JOB_FUNCTION`); the
worker's own loop (worker/intake/rqworker.py) hands each job's spec to `JobRunner.start`, which
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import redis

from contract import errors, keys, logs, queueing
from contract.entries import CANCELLED, LENGTH, STOP, TOOL_CALLS, TokenLogprob
from contract.jobspec import InvalidSpec, JobSpec, digest
from contract.keys import BatchCounters, JobStatus
from worker.attempts.claims import Attempt, Claims, Fenced, JobGone, NotRecorded, RolledBack
from worker.attempts.durability import Durability
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.publisher import Publisher
from worker.engine.devices import Placement
from worker.engine.held import HeldPrefixes
from worker.engine.picks import Pick
from worker.errors import GrammarDeadEnd, PromptRejected
from worker.redis.link import Link
from worker.redis.retrying import TRANSIENT
from worker.text.replies import Reply
from worker.text.textstream import Piece, TextAssembler

log = logging.getLogger(__name__)

CLAIM_CONFIRM_S = 5.0  # how long an attempt waits for a replica to hold its claim (`_settle_claim`)
CLAIM_WAIT_MS = 250  # each WAIT of that


class Engine(Protocol):
    model_name: str
    n_ctx: int
    slots: int  # sequences decoded together (SLOTS, or sized at start: worker/engine/sizing.py)

    def prompt_ids(self, spec: JobSpec) -> list[int]: ...
    def is_end(self, token: int) -> bool: ...
    def piece(self, token: int) -> bytes: ...
    def reply(self, spec: JobSpec) -> Reply: ...
    def tokens(
        self,
        spec: JobSpec,
        prompt: list[int],
        prior: list[int],
        progress: Callable[[], None] | None = None,
        alone_for: int = 0,
    ) -> Iterator[tuple[Pick, bytes]]: ...
    def warm_up(self, budget_s: float = 30.0) -> float: ...
    def counters(self) -> BatchCounters: ...
    def step_ms(self) -> float: ...

    placement: Placement | None  # where the model and its cache are (None: no model)
    held: HeldPrefixes | None  # the prefixes its slots hold (None: no cache)


class Outcome(StrEnum):
    """How a job function call or an attempt ended (logged; RQ keeps no result)."""

    STARTED = "started"  # claimed: the attempt runs on its own thread
    SKIPPED = "skipped"  # ended, cancelled or late before it started
    REFUSED = "refused"  # not a job the API recorded (a planted or malformed spec): not run
    WRONG_MODEL = "wrong-model"  # a job for another model: ended with model_not_found
    STOP = STOP
    LENGTH = LENGTH
    CANCELLED = CANCELLED
    REJECTED = "rejected"  # the prompt cannot run here (too long, no chat template)
    DEADLINE = "deadline_exceeded"
    FENCED = "fenced"  # another attempt took over
    HANDED_OFF = "handed-off"  # given back at shutdown


@dataclass(frozen=True)
class Claimed:
    spec: JobSpec
    attempt: Attempt


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
        link: Link,
        heartbeat: Heartbeat,
        window_ms: int,
        durability: Durability | None = None,
        linger_s: float = 0.0,
        shutdown_grace_s: float = 20.0,
        log_content: bool = False,
        slots: int = 1,
    ) -> None:
        self.engine = engine
        self.link = link
        self.claims = Claims(link, window_ms)
        self.counters = (
            BatchCounters()
        )  # the job threads' and the publisher's (worker/intake/presence.py adds them)
        self.publisher = Publisher(
            link,
            linger_s,
            crowded=lambda: self.running() > 1,
            counters=self.counters,
            holding=durability is not None,
        )
        self.heartbeat = heartbeat
        # a failover lost an attempt's claim: its next write claims again (the heartbeat does
        # not wait for it, beating for the others)
        heartbeat.rolled_back = lambda attempt: self.publisher.resend(attempt, wait=False)
        self.durability = durability
        if durability is not None:
            durability.resend = self.publisher.resend
        self._shutdown_grace = shutdown_grace_s
        self._shutdown_at: float | None = None
        self._log_content = log_content  # LOG_CONTENT: prompts and completions in the log
        self._free = threading.BoundedSemaphore(slots)
        self._threads: dict[threading.Thread, Claimed] = {}
        self._suspects = 0  # running attempts at suspect jobs not yet cleared (at most one)
        self._batch_lines = 0  # running attempts at Batch API lines (at most BATCH_SLOTS)
        self._lock = threading.Lock()
        self._last_end = time.monotonic()  # when the last attempt ended (or the start)
        # the worker loop's: a queue it leaves out (batch lines, suspects) may be taken from again
        self.queue_opened: Callable[[], None] = lambda: None

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

    def running_suspects(self) -> int:
        with self._lock:
            return self._suspects

    def running_batch_lines(self) -> int:
        with self._lock:
            return self._batch_lines

    def preempt_batch_line(self) -> str | None:
        """Make one running Batch API line give its job back at its next token: one already
        generating (a line still reading its prompt would stop only once it is read), and of
        those the one with the fewest tokens generated (the least to read again when it
        resumes); never a suspect (it would come back first, from the suspect queue).
        Returns its completion id."""
        with self._lock:
            lines = [
                c.attempt
                for c in self._threads.values()
                if c.spec.priority == keys.BATCH and not c.attempt.preempted and not c.attempt.suspect
            ]
            if not lines:
                return None
            victim = min(lines, key=lambda a: (a.generated == 0, a.prior + a.generated))
            victim.preempted = True
            return victim.completion_id

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

    def start(self, raw_spec: dict, rq_job_id: str) -> Outcome:
        """Claim the job RQ knows as `rq_job_id` and run the attempt on its own thread, in the
        slot the caller reserved; returns at once (RQ's record of the job ends here, the job's
        own record lives on in Redis with its heartbeat)."""
        try:
            with _logged_as(keys.completion_of(rq_job_id)):
                claimed = self._claim(raw_spec, rq_job_id)
        except BaseException:
            self._free.release()
            raise
        if not isinstance(claimed, Claimed):
            self._free.release()
            return claimed
        thread = threading.Thread(
            target=self._in_thread, args=(claimed,), name=f"job-{claimed.spec.id}", daemon=True
        )
        with self._lock:
            self._threads[thread] = claimed
            self._suspects += claimed.attempt.suspect
            self._batch_lines += claimed.spec.priority == keys.BATCH
        thread.start()
        return Outcome.STARTED

    def _in_thread(self, claimed: Claimed) -> None:
        logs.set_completion(claimed.spec.id)
        try:
            outcome = self._attempt(claimed.spec, claimed.attempt)
            log.info("%s: %s", claimed.spec.id, outcome)
        except Exception:
            pass  # logged and reported to the client by _attempt
        finally:
            with self._lock:
                self._threads.pop(threading.current_thread(), None)
                self._suspects -= claimed.attempt.suspect
                self._batch_lines -= claimed.spec.priority == keys.BATCH
                self._last_end = time.monotonic()
            self._free.release()
            if claimed.spec.priority == keys.BATCH or claimed.attempt.suspect:
                self.queue_opened()

    def _claim(self, raw_spec: dict, rq_job_id: str) -> Claimed | Outcome:
        """Check the job and claim it; or why it does not run here. Only a spec the API
        recorded for the job that the RQ job id names is run."""
        try:
            spec = JobSpec.from_dict(raw_spec)
        except InvalidSpec as exc:
            log.warning("refused job %s: invalid arguments: %s", rq_job_id, exc)
            return Outcome.REFUSED
        if spec.id != keys.completion_of(rq_job_id):
            log.warning("refused job %s: it carries the spec of %s", rq_job_id, spec.id)
            return Outcome.REFUSED
        if spec.model != self.engine.model_name:
            self.claims.end(
                spec.id, errors.MODEL_NOT_FOUND.entry(f"This worker serves {self.engine.model_name}.")
            )
            return Outcome.WRONG_MODEL
        try:
            attempt = self.claims.claim(spec.id, digest(raw_spec))
        except JobGone:
            return Outcome.SKIPPED
        except NotRecorded:
            log.warning("refused job %s: not the spec the API recorded", rq_job_id)
            return Outcome.REFUSED
        except TRANSIENT:
            raise  # Redis away for long: the job stays with the caller until it is back
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
        return Claimed(spec, attempt)

    def _attempt(self, spec: JobSpec, attempt: Attempt) -> Outcome:
        self.heartbeat.track(attempt)
        if self.durability is not None:
            self.durability.track(attempt)
        try:
            return self._generate(spec, attempt)
        except Fenced as exc:
            log.warning("attempt fenced out, abandoning job: %s", exc)
            return Outcome.FENCED
        except RolledBack as exc:  # the job goes on from what the stream holds (docs/protocol.md)
            log.error("%s; handing the job off", exc)
            self._hand_off(attempt)
            return Outcome.HANDED_OFF
        except HandedOff:
            return Outcome.HANDED_OFF
        except (SystemExit, KeyboardInterrupt):  # cold shutdown: give the job back first
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
        progress = self.claims.progress(spec.id)
        attempt.saw(progress.last_id)
        prior = list(progress.token_ids)
        try:
            prompt = engine.prompt_ids(spec)
        except PromptRejected as exc:
            pub.failed(attempt, exc.error, str(exc), exc.param)
            return Outcome.REJECTED
        prompt_tokens = progress.prompt_tokens or len(prompt)
        self._settle_claim(attempt)
        pub.started(attempt, prompt_tokens, after=progress.last_id)
        generated = attempt.prior = len(prior)
        if prior:
            log.info("resuming %s after %d tokens (attempt epoch %d)", spec.id, generated, attempt.epoch)
        context = prompt + prior
        if attempt.cancelled:
            pub.finished(attempt, CANCELLED, prompt_tokens, generated)
            return Outcome.CANCELLED
        if (spec.max_tokens is not None and generated >= spec.max_tokens) or len(context) >= engine.n_ctx:
            pub.finished(attempt, LENGTH, prompt_tokens, generated)
            return Outcome.LENGTH

        assembler = TextAssembler(spec.stop)
        reply = engine.reply(spec)
        if prior:  # the text the earlier attempts generated: the reply goes on where it was
            reply.feed(b"".join(engine.piece(t) for t in prior).decode("utf-8", "replace"))
        out = _Output(engine, pub, attempt, reply, spec.logprobs)
        reason = LENGTH  # the context window filled up

        def progressed() -> None:  # a step read part of the prompt: not a hung native call
            attempt.progress_at = time.monotonic()

        try:
            alone_for = self.link.recovery.suspect_tokens if attempt.suspect else 0
            for pick, piece in self._timed(engine.tokens(spec, prompt, prior, progressed, alone_for)):
                token = pick.token
                attempt.progress_at = time.monotonic()
                attempt.generated += 1
                if progress.deadline_ms is not None and time.time() * 1000 > progress.deadline_ms:
                    out.send(assembler.flush())
                    out.end()
                    pub.failed(attempt, errors.DEADLINE)
                    return Outcome.DEADLINE
                attempt.check()
                if self._shutdown_at is not None and time.monotonic() >= self._shutdown_at:
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
                if attempt.preempted:  # after the checks above: a line that just ended is not given back
                    self._hand_off(attempt, queueing.PREEMPT)
                    raise HandedOff()
        except GrammarDeadEnd as exc:  # the job's own grammar cannot go on: say so, end it
            out.send(assembler.flush())
            out.end()
            pub.failed(attempt, errors.INVALID_REQUEST, f"The output cannot continue its grammar: {exc}")
            return Outcome.REJECTED
        out.send(assembler.flush())
        out.end()
        if reason == STOP and reply.calls:
            reason = TOOL_CALLS
        pub.finished(attempt, reason, prompt_tokens, generated)
        if self._log_content:  # opt-in, for debugging only: the log then holds user data
            prompt_text = [m.content for m in spec.messages] if spec.kind == "chat" else spec.prompt
            log.warning("LOG_CONTENT prompt=%r completion (this attempt)=%r", prompt_text, out.said())
        return Outcome(reason)

    def _settle_claim(self, attempt: Attempt) -> None:
        """Before the attempt writes anything a client could be sent, wait until the
        replicas a failover could promote hold its claim (worker/attempts/durability.py). A primary the
        sentinels have just replaced takes writes until they say so (about a second): a job
        claimed there alone would run beside the attempt another worker starts on the new
        primary, and clients sent the first's text from the old one would then be sent the
        second's. A claim the new primary lacks is made again there (an empty APPEND): of
        two attempts, the one that claims first runs; the other is fenced having written
        nothing. Without an answer in CLAIM_CONFIRM_S (the replica away, its primary still
        the primary), the attempt runs anyway, as the API answers for a new job anyway."""
        durability = self.durability
        if durability is None or not durability.replicas_expected(attempt.completion_id):
            return
        deadline = time.monotonic() + CLAIM_CONFIRM_S
        while True:
            replicas = max(durability.replicas_expected(attempt.completion_id), 1)
            current, acked = self.claims.replicated(attempt, replicas, CLAIM_WAIT_MS)
            if current == 0:
                attempt.fenced = True
                attempt.check()
            if current == 2:
                log.warning(
                    "%s: the new primary lacks attempt %d's claim; claiming",
                    attempt.completion_id,
                    attempt.epoch,
                )
                self.publisher.resend(attempt)
            elif acked >= replicas:
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "no replica acknowledged the claim of %s in %.0fs: running it anyway",
                    attempt.completion_id,
                    CLAIM_CONFIRM_S,
                )
                return

    def _clear_suspect(self, attempt: Attempt) -> None:
        """A suspect that went on past where its batch died is cleared (a job that kills
        workers where it stands would have died again): the worker may take the next suspect,
        so a dead batch's jobs are read again side by side rather than one after another."""
        cleared = self.claims.clear_suspect(attempt)  # False: no longer the job's attempt
        with self._lock:  # either way not asked again at every token: its next write is fenced
            self._suspects -= 1
            attempt.suspect = False
        self.queue_opened()
        if cleared:
            log.info("%s is no longer a suspect (%d tokens on)", attempt.completion_id, attempt.generated)

    def _timed(self, picks: Iterator[tuple[Pick, bytes]]) -> Iterator[tuple[Pick, bytes]]:
        """The picks, with this thread's own work on each (from its arrival to the ask for the
        next) added to the profile's counters (a lost increment between threads is a rounding
        error there)."""
        for item in picks:
            got = time.perf_counter()
            yield item
            self.counters.token_us += int((time.perf_counter() - got) * 1e6)
            self.counters.tokens += 1

    def _hand_off(self, attempt: Attempt, reason: str = "handoff") -> None:
        """Give the job back (shutting down, or preempted); a continuation is enqueued for
        another worker. What this attempt generated is written first, so the continuation
        need not redo it."""
        with contextlib.suppress(Fenced, RolledBack, redis.RedisError):
            self.publisher.flush(attempt)
        try:
            link = self.link
            outcome = queueing.abandon(
                link.servers, attempt.completion_id, attempt.epoch, link.recovery, reason, charge=False
            )
            log.log(
                logging.INFO if reason == queueing.PREEMPT else logging.WARNING,
                "handed off %s (%s, outcome %d)",
                attempt.completion_id,
                reason,
                outcome,
            )
        except redis.RedisError as exc:  # the reaper will find the attempt dead instead
            log.warning("could not hand off %s: %s", attempt.completion_id, exc)


class _Output:
    """An attempt's text on its way to the stream: each released piece read by the job's
    reply (content and tool-call fragments) and published with its tokens' logprobs."""

    def __init__(
        self, engine: Engine, pub: Publisher, attempt: Attempt, reply: Reply, logprobs: bool
    ) -> None:
        self._engine, self._pub, self._attempt, self._reply = engine, pub, attempt, reply
        self._logprobs = logprobs
        self._held: list[TokenLogprob] = []  # for the tokens the assembler holds back
        self._said: list[str] = []

    def picked(self, pick: Pick, piece: bytes) -> None:
        if self._logprobs and pick.logprob is not None:
            top = tuple((self._engine.piece(t), lp) for t, lp in pick.top)
            self._held.append(TokenLogprob(piece, pick.logprob, top))

    def send(self, piece: Piece | None) -> None:
        if piece is None:
            return
        parts = self._reply.feed(piece.text)
        n = len(piece.token_ids)
        logprobs, self._held = tuple(self._held[:n]), self._held[n:]
        self._pub.delta(self._attempt, parts.content, piece.token_ids, tuple(parts.calls), logprobs)
        self._said.append(piece.text)

    def end(self) -> None:
        """What the reply still held (text that might have opened a tool call)."""
        parts = self._reply.end()
        if parts:
            self._pub.delta(self._attempt, parts.content, (), tuple(parts.calls))

    def said(self) -> str:
        return "".join(self._said)


@contextlib.contextmanager
def _logged_as(completion_id: str) -> Iterator[None]:
    """What is logged meanwhile carries the job's completion id."""
    logs.set_completion(completion_id)
    try:
        yield
    finally:
        logs.set_completion("")


def generate(spec: dict) -> str:
    """The job function RQ records for every job (`JOB_FUNCTION`). Only worker/intake/rqworker.py's
    loop runs jobs, calling `JobRunner.start` with the RQ job id; calling this is an error."""
    raise RuntimeError("tokenspool jobs are run by the worker loop (worker/intake/rqworker.py), not by RQ")
