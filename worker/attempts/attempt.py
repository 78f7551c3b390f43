"""Taking a job. A claim starts an attempt and fences out every earlier one. `Claims` also
reads back what earlier attempts published. It ends a job that no attempt of ours holds, too.

An `Attempt` is one worker's hold on one job. It carries one state of
contract/lifecycle/attempt.py, moved by name (`move`). What the publisher and the heartbeat
learn about it moves it too. `fence` says another attempt, or an END, took over. `cancel` says
a cancel is due. `error` (a write failed for good) stays apart. Its next call raises either.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from contract import entries, keys
from contract.entries import Delta, Entry, Failed, Finished, Started
from contract.lifecycle import attempt as life
from contract.lua import attempts, jobs, library
from contract.servers import is_sentinel
from worker.attempts import tracing
from worker.attempts.tracing import AttemptTrace, Off
from worker.redis.link import Link


class Fenced(Exception):
    """This attempt may not write to the job any more."""


class JobGone(Exception):
    """The job hash does not exist (expired, purged) or the job cannot start (ended, late)."""


class NotRecorded(Exception):
    """The spec to run is not the one the API recorded for the job (a planted job)."""


class RolledBack(Exception):
    """A failover lost entries of this attempt that it no longer holds. It cannot go on
    without contradicting what a client may have seen."""


# one attempt is one object: hashed by identity
@dataclass(eq=False)
class Attempt:
    """One worker's attempt at one job. Its `state` moves by name (`move`). The job thread,
    the publisher's writer and the heartbeat move it. The flags read from the moves made.

    Some facts outlive the state that set them. The flags they replace did too.
    - `ended` holds once its terminal entry is written. It holds even if a beat then fences it.
    - `cancelled` and `preempted` hold once asked. Both may hold, as for a preempted batch line
      whose batch is cancelled. The state then says `stopping`. The text path ends it
      cancelled. An embedding gives it back first (worker/attempts/embedding.py).
    - `suspect` is where the job came from, not a state. It holds from the claim until the
      move `clear`, through `claimed`, `stopping` or an end. The runner counts it till then.
    """

    job_id: str
    epoch: int
    # last token (or the claim)
    progress_at: float = field(default_factory=time.monotonic)
    # tokens this attempt wrote
    published: int = 0
    # entries this attempt wrote (APPEND numbers them: a retry skips these)
    written: int = 0
    # the job came from its model's suspect queue
    from_suspects: bool = False
    # a suspect: the most suspects it may step with (0: any; JobField.GROUP)
    group: int = 0
    # tokens earlier attempts generated (this one read them again)
    prior: int = 0
    # tokens this attempt has generated (published or not yet)
    generated: int = 0
    # a write failed for good: raised by the next call
    error: Exception | None = None
    # the claim's token, worker and heartbeat window (`attempts.Claim`)
    token: str = ""
    worker: str = ""
    window_ms: int = 0
    # the key that sent the job (an embed job's, once read: JobField.OWNER)
    owner: str = ""
    # What this attempt wrote that a failover could still take back (not yet on a replica):
    # (its number in the attempt, its stream id, the entry), oldest first. The publisher adds
    # to it, worker/attempts/durability.py trims it, and a write that finds the job behind writes
    # these again with the ids they had.
    record: list[tuple[int, str, Entry]] = field(default_factory=list)
    # the newest id of the job's stream this attempt knows
    newest: tuple[int, int] = (0, 0)
    # its span (worker/attempts/tracing.py), set at the claim
    trace: AttemptTrace | Off = tracing.OFF
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _state: str = field(default=life.CLAIMED.name, init=False)
    # its moves, oldest first
    _made: tuple[str, ...] = field(default=("claim",), init=False)
    _moving: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def move(self, name: str) -> str:
        """Make the move `name` (contract/lifecycle/attempt.py) and return the new state. It
        raises IllegalMove if the state does not allow it. A start goes to `proving` for a
        suspect. A move that leaves the state as it was is recorded once, since a heartbeat
        fences at each beat."""
        with self._moving:
            to = ("proving" if self.suspect else "running") if name == "start" else ""
            before, self._state = self._state, life.after(self._state, name, to)
            if self._state != before or name not in self._made:
                self._made += (name,)
            return self._state

    @property
    def state(self) -> str:
        return self._state

    @property
    def made(self) -> tuple[str, ...]:
        """The moves it has made, oldest first."""
        return self._made

    @property
    def fenced(self) -> bool:
        """Another attempt, or an end, took its job: it may not write to it any more."""
        return self._state == life.FENCED.name

    @property
    def cancelled(self) -> bool:
        """A cancel is due: it ends with Finished(cancelled) at its next token."""
        return "cancel" in self._made

    @property
    def preempted(self) -> bool:
        """It gives its job back at its next token (a batch line making room)."""
        return "preempt" in self._made

    @property
    def ended(self) -> bool:
        """Its terminal entry is written."""
        return "end" in self._made

    @property
    def suspect(self) -> bool:
        """A suspect not yet cleared: the job came from its model's suspect queue."""
        return self.from_suspects and "clear" not in self._made

    @property
    def resumed(self) -> bool:
        """A continuation: an earlier attempt of the job ran (its stream may have stalled)."""
        return self.epoch > 1

    @property
    def claim(self) -> attempts.Claim:
        return attempts.Claim(self.epoch, self.token, self.worker, self.window_ms)

    def saw(self, entry_id: str) -> None:
        """An id in the job's stream, read or written. The ids this attempt chooses come after it."""
        ms, _, seq = entry_id.partition("-")
        self.newest = max(self.newest, (int(ms), int(seq or 0)))

    def next_ids(self, n: int) -> list[str]:
        """Stream ids for `n` new entries, after every id this attempt knows. They are chosen
        here, not by Redis. If a failover loses an APPEND's reply, the APPEND is retried on the
        promoted replica. That replica lacks what the APPEND wrote. The retry must write the ids
        a client may have been sent from the old primary. Otherwise that client would be sent
        the same entries again."""
        ms, seq = self.newest
        now = int(time.time() * 1000)
        ids = []
        for _ in range(n):
            ms, seq = (now, 0) if now > ms else (ms, seq + 1)
            ids.append(f"{ms}-{seq}")
        self.newest = (ms, seq)
        return ids

    def wrote(self, rows: list[tuple[int, str, Entry]]) -> None:
        """Entries written (their numbers, ids), to hold until they are safe."""
        with self._lock:
            self.record.extend(rows)

    def held_from(self, seq: int) -> list[tuple[str, Entry]] | None:
        """The entries from number `seq` on, with their ids. None if some are no longer held.
        They were already trimmed as safe: a failover took back what a replica had confirmed."""
        with self._lock:
            if seq >= self.written:
                return []
            if not self.record or self.record[0][0] > seq:
                return None
            return [(i, e) for n, i, e in self.record if n >= seq]

    def confirm(self, upto: int) -> None:
        """Entries numbered below `upto` are safe (on a replica, or synced): forget them."""
        with self._lock:
            self.record = [row for row in self.record if row[0] >= upto]

    def check(self) -> None:
        """Raise what the writer learned: fenced out, or a write that failed."""
        if self.fenced:
            raise Fenced(f"{self.job_id} epoch {self.epoch}: another attempt took over")
        if self.error is not None:
            raise self.error


@dataclass(frozen=True)
class Progress:
    """What earlier attempts of a job already published."""

    prompt_tokens: int | None = None
    token_ids: tuple[int, ...] = ()
    # the job's overall deadline, if it has one
    deadline_ms: int | None = None
    # the id of the last entry read ("0-0": none)
    last_id: str = "0-0"
    # when its stream last moved (ms, Unix): its last Delta, else its first entry
    moved_ms: int = 0
    # the key that sent the job (its hash; "" where the API takes no keys)
    owner: str = ""
    # the epoch of the last attempt that started (0: none did)
    epoch: int = 0


class Claims:
    def __init__(self, link: Link, window_ms: int) -> None:
        self._link = link
        self._client = link.streams
        # the heartbeat window a claim starts with
        self._window_ms = window_ms
        self._claim = link.streams.register_script(attempts.CLAIM)
        self._end = link.streams.register_script(jobs.END)
        self._fail = link.streams.register_script(attempts.FAIL)
        self._clear_suspect = link.streams.register_script(attempts.CLEAR_SUSPECT)
        self._beat = link.streams.register_script(attempts.BEAT)

    def claim(self, job_id: str, spec_digest: str) -> Attempt:
        """Start a new attempt at a job, fencing out every earlier one. The attempt is for the
        spec whose digest is given. It raises NotRecorded if the API recorded another. A job
        that waited past its start deadline is ended by the claim instead (JobGone). The
        claim's token makes a retry return the same attempt. A retry comes after a Redis blip
        lost the reply."""
        link = self._link
        token = uuid.uuid4().hex
        args = attempts.claim_args(
            link.worker, job_id, self._window_ms, link.recovery.retention_s, token, spec_digest
        )
        epoch, cancel, suspect, group = link.retry(
            lambda: self._claim(keys=library.job_keys(job_id), args=args)
        )
        if epoch == -2:
            raise NotRecorded(job_id)
        # gone, ended, late; or -3: a live attempt runs it
        if epoch <= 0:
            raise JobGone(job_id)
        attempt = Attempt(
            job_id,
            int(epoch),
            from_suspects=bool(suspect),
            group=int(group),
            token=token,
            worker=link.worker,
            window_ms=self._window_ms,
        )
        if cancel:
            attempt.move("cancel")
        return attempt

    def replicated(
        self, attempt: Attempt, replicas: int, wait_ms: int, ask_sentinels: bool = False
    ) -> tuple[int, int, bool]:
        """BEAT the attempt, then `WAIT replicas`, and return three values. The BEAT is a
        write, on the connection that then waits. First: the BEAT's answer (1 current, 0
        fenced, 2 its claim lost in a failover). Second: how many replicas hold it, and so the
        claim and all written before it. Third: whether the server that answered is still the
        sentinels' primary. `ask_sentinels` asks for the third, at one more round trip.
        Without it, or without sentinels, the third is True."""
        job_id = attempt.job_id
        sentinel = ask_sentinels and is_sentinel(self._client)

        def once() -> tuple[list, bool]:
            with self._client.pipeline(transaction=False) as pipe:
                # the answering connection, to compare with the sentinels' primary
                if sentinel:
                    pool = self._client.connection_pool
                    # released by the pipeline
                    pipe.connection = pool.get_connection()
                    address = (pipe.connection.host, pipe.connection.port)
                beat_args = [attempt.epoch, attempt.window_ms, attempt.token]
                self._beat(keys=[keys.job(job_id), keys.alive(job_id)], args=beat_args, client=pipe)
                pipe.execute_command("WAIT", replicas, wait_ms)
                answers = pipe.execute()
            # A changed primary also drops the pool's idle connections to the old one.
            primary = not sentinel or pool.get_master_address() == address  # type: ignore[attr-defined]
            return answers, primary

        (current, acked), primary = self._link.retry(once)
        return int(current), int(acked), primary

    def clear_suspect(self, attempt: Attempt) -> bool:
        """The attempt's job is no longer a suspect: it went on past where its batch died.
        False when the attempt is no longer the job's current one."""
        job_id = attempt.job_id
        return bool(
            self._link.retry(
                lambda: self._clear_suspect(keys=[keys.job(job_id)], args=[attempt.epoch, attempt.token])
            )
        )

    def progress(self, job_id: str) -> Progress:
        """Read back what earlier attempts published (token ids are the contract's truth)."""
        prompt_tokens = None
        ids: list[int] = []
        after, last_id, moved, epoch = "-", "0-0", "", 0
        stream = keys.events(job_id)
        while True:
            rows = self._link.retry(lambda a=after: self._client.xrange(stream, min=a, count=1000))
            for entry_id, fields in rows:
                last_id = entry_id.decode()
                moved = moved or last_id
                entry = entries.decode(fields)
                if isinstance(entry, Started):
                    prompt_tokens = entry.prompt_tokens if prompt_tokens is None else prompt_tokens
                    epoch = entry.epoch
                elif isinstance(entry, Delta):
                    ids.extend(entry.token_ids)
                    moved = last_id
            if len(rows) < 1000:
                deadline, owner = self._link.retry(
                    lambda: self._client.hmget(keys.job(job_id), keys.JobField.DEADLINE, keys.JobField.OWNER)
                )
                deadline_ms = int(deadline) if deadline else None
                moved_ms = int(moved.split("-")[0]) if moved else 0
                owner_id = owner.decode() if isinstance(owner, bytes) else owner or ""
                return Progress(prompt_tokens, tuple(ids), deadline_ms, last_id, moved_ms, owner_id, epoch)
            after = "(" + rows[-1][0].decode()

    def cancel_due(self, job_id: str) -> bool:
        """Whether a cancel of the job is due: its CANCEL_AT has passed. An attempt that writes
        nothing for a while (an embed job) asks this. Others learn it from APPEND."""
        at = self._link.retry(lambda: self._client.hget(keys.job(job_id), keys.JobField.CANCEL_AT))
        return at is not None and time.time() * 1000 >= int(at)

    def fail(self, attempt: Attempt, entry: Failed) -> bool:
        """End the attempt's own job with `entry` (FAIL), as long as the attempt is current.
        A full Redis (maxmemory, noeviction) still takes this when it refused the attempt's
        entries. False if the attempt was no longer current or the job had ended."""
        job_id = attempt.job_id
        args = attempts.fail_args(job_id, attempt.claim, entry, self._link.recovery.retention_s)
        return bool(self._link.retry(lambda: self._fail(keys=library.job_keys(job_id), args=args)))

    def end(self, job_id: str, entry: Failed | Finished, only_if_status: str = "") -> bool:
        """End a job that no attempt of ours holds (e.g. arguments that fail validation)."""
        retention = self._link.recovery.retention_s
        return bool(
            self._link.retry(
                lambda: self._end(
                    keys=library.job_keys(job_id),
                    args=jobs.end_args(job_id, entry, retention, only_if_status),
                )
            )
        )
