"""Running jobs, up to SLOTS attempts at once. Each runs on its own thread, in one of the
worker's slots. The engine decodes them together. The rules of one attempt are in
worker/attempts/rules.py.

RQ records every job as a call of `generate(spec)` (`contract.keys.JOB_FUNCTION`). The
worker's own loop (worker/intake/rqworker.py) hands each job's spec to `JobRunner.start`.
That claims the job and returns.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from contract import keys, logs, tiers
from contract.stats import BatchCounters
from worker.attempts import tracing
from worker.attempts.attempt import Attempt, Claims
from worker.attempts.durability import Durability
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.proofs import ProofTurns
from worker.attempts.publisher import Publisher
from worker.attempts.rules import AttemptRules, JobAttempt, Outcome
from worker.attempts.slots import Slots
from worker.engine.protocol import Engine
from worker.redis.link import Link

log = logging.getLogger(__name__)


class JobRunner:
    """Runs attempts, up to `slots` at once. RQ's loop reserves a slot before it takes a job
    from the queue (`reserve`). `start` claims the job and runs it on its own thread. The slot
    is free again when that attempt ends. The engine decodes the running attempts together.
    `AttemptRules` runs each."""

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
        guest: bool = False,
    ) -> None:
        self.engine = engine
        self.link = link
        log.debug("tracing %s", "on" if tracing.start() else "off (OpenTelemetry not imported)")
        self.claims = Claims(link, window_ms)
        # the job threads' and the publisher's (worker/intake/presence.py adds them)
        self.counters = BatchCounters()
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
        self.rules = AttemptRules(
            engine,
            link,
            self.claims,
            self.publisher,
            heartbeat,
            durability,
            self.counters,
            log_content,
            self._suspect_cleared,
        )
        self._shutdown_grace = shutdown_grace_s
        # guest: an embedding worker's (worker/attempts/slots.py)
        self._free = Slots(slots, guest)
        self._free.owners = self._owners
        self._threads: dict[threading.Thread, JobAttempt] = {}
        # running attempts at suspects not yet cleared
        self._suspects: set[Attempt] = set()
        # when the next group of suspects may start proving
        self._proofs = ProofTurns()
        # running attempts at Batch API lines (at most BATCH_SLOTS)
        self._batch_lines = 0
        self._lock = threading.Lock()
        # when the last attempt ended (or the start)
        self._last_end = time.monotonic()
        # the worker loop's: a queue it leaves out (batch lines, suspects) may be taken from again
        self.queue_opened: Callable[[], None] = lambda: None

    def request_shutdown(self, grace_s: float | None = None) -> None:
        """SIGTERM: finish the running jobs if they end within the grace period, else hand
        them off. A second signal hands them off now."""
        at = time.monotonic() + (self._shutdown_grace if grace_s is None else grace_s)
        if self.rules.shutdown_at is None or at < self.rules.shutdown_at:
            self.rules.shutdown_at = at

    def reserve(self, timeout: float) -> bool:
        """Wait up to `timeout` for a free slot. The caller then takes one job and `start`s it."""
        return self._free.reserve(timeout)

    def unreserve(self) -> None:
        self._free.release()

    def turns(self) -> tuple[list[str], bool] | None:
        """For TAKE on an embedding worker, where keys take turns (worker/attempts/slots.py).
        It gives the owners of the running jobs, and whether the slot reserved is the guest
        slot. None elsewhere (first come, first taken)."""
        return (self._owners(), self._free.in_guest()) if self._free.turns else None

    def _owners(self) -> list[str]:
        """The owners of the running jobs (under the slots' lock: never takes the runner's long)."""
        with self._lock:
            return [c.attempt.owner for c in self._threads.values()]

    def running(self) -> int:
        with self._lock:
            return len(self._threads)

    def running_suspects(self) -> tuple[int, int]:
        """How many uncleared suspects run here, and the most their group may hold. They step
        as one group (worker/engine/steps/plan.py). The most is the least `group` of theirs
        (0: any)."""
        with self._lock:
            caps = [a.group for a in self._suspects if a.group]
            return len(self._suspects), min(caps, default=0)

    def proof_may_start(self) -> bool:
        """Whether a new group of suspects may start proving here (worker/attempts/proofs.py).
        None may be proving. The continuations read again here must have had their turn.
        Their streams stalled where a worker died, and they wait while suspects prove."""
        with self._lock:
            reading = sum(
                c.attempt.resumed and not c.attempt.generated and not c.attempt.suspect
                for c in self._threads.values()
            )
            return self._proofs.may_start(reading)

    def running_batch_lines(self) -> int:
        with self._lock:
            return self._batch_lines

    def preempt_batch_line(self) -> str | None:
        """Make one running Batch API line give its job back at its next token. It picks one
        already generating. A line still reading its prompt would stop only once it is read.
        Of those, it picks the one with the fewest tokens generated: the least to read again
        when it resumes. It never picks a suspect, which would come back first, from the
        suspect queue. Returns its job id."""
        with self._lock:
            lines = [
                c.attempt
                for c in self._threads.values()
                if c.spec.priority == tiers.BATCH and not c.attempt.preempted and not c.attempt.suspect
            ]
            if not lines:
                return None
            victim = min(lines, key=lambda a: (a.generated == 0, a.prior + a.generated))
            victim.move("preempt")
            return victim.job_id

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

    def start(self, raw_spec: dict, rq_job_id: str, owner: str = "") -> Outcome:
        """Claim the job RQ knows as `rq_job_id`, and run the attempt on its own thread. It
        runs in the slot the caller reserved. It returns at once. RQ's record of the job ends
        here. The job's own record lives on in Redis with its heartbeat. `owner` (its RQ
        record's) counts for the keys' turns until the attempt reads the job's own."""
        try:
            with _logged_as(keys.job_of(rq_job_id)):
                claim_at = time.time_ns()
                claimed = self.rules.claim(raw_spec, rq_job_id)
        except BaseException:
            self._free.release()
            raise
        if not isinstance(claimed, JobAttempt):
            self._free.release()
            return claimed
        # its span opens with the claim (worker/attempts/tracing.py)
        attempt = claimed.attempt
        attempt.owner = attempt.owner or owner
        attempt.trace = tracing.begin(claimed.spec, attempt.epoch, attempt.worker, (claim_at, time.time_ns()))
        thread = threading.Thread(
            target=self._in_thread, args=(claimed,), name=f"job-{claimed.spec.id}", daemon=True
        )
        with self._lock:
            self._threads[thread] = claimed
            if claimed.attempt.suspect:
                self._suspects.add(claimed.attempt)
                self._proofs.began()
            self._batch_lines += claimed.spec.priority == tiers.BATCH
        thread.start()
        return Outcome.STARTED

    def _in_thread(self, claimed: JobAttempt) -> None:
        logs.set_job(claimed.spec.id)
        attempt, outcome = claimed.attempt, "failed"
        try:
            outcome = self.rules.run(claimed.spec, attempt)
            log.info("%s: %s", claimed.spec.id, outcome)
        except Exception:
            # logged and reported to the client by AttemptRules.run
            pass
        finally:
            attempt.trace.ended(outcome, attempt.published, attempt.generated)
            with self._lock:
                self._threads.pop(threading.current_thread(), None)
                self._discard_suspect(claimed.attempt)
                self._batch_lines -= claimed.spec.priority == tiers.BATCH
                self._last_end = time.monotonic()
            # the loop may wait on a take for the guest slot only
            guest = self._free.in_guest()
            self._free.release()
            if claimed.spec.priority == tiers.BATCH or claimed.attempt.suspect or guest:
                self.queue_opened()

    def _suspect_cleared(self, attempt: Attempt) -> None:
        """A suspect that went on past where its batch died is cleared. A job that kills
        workers where it stands would have died again. The worker may then take the next
        suspect. So a dead batch's jobs are read again side by side, not one after another."""
        with self._lock:
            self._discard_suspect(attempt)
            attempt.move("clear")
        self.queue_opened()

    def _discard_suspect(self, attempt: Attempt) -> None:
        """(Under the lock.) The attempt no longer proves: the group's proof ends with its last."""
        if attempt in self._suspects:
            self._suspects.discard(attempt)
            if not self._suspects:
                self._proofs.ended()


@contextlib.contextmanager
def _logged_as(job_id: str) -> Iterator[None]:
    """What is logged meanwhile carries the job's job id."""
    logs.set_job(job_id)
    try:
        yield
    finally:
        logs.set_job("")


def generate(spec: dict) -> str:
    """The job function RQ records for every job (`JOB_FUNCTION`). Only worker/intake/rqworker.py's
    loop runs jobs, calling `JobRunner.start` with the RQ job id. Calling this is an error."""
    raise RuntimeError("tokenspool jobs are run by the worker loop (worker/intake/rqworker.py), not by RQ")
