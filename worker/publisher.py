"""Fenced writes of attempts' entries to their jobs' streams, off the generating thread.

Every write goes through the contract's Lua scripts, so a worker that is no longer the
current attempt (declared dead, job ended or cancelled elsewhere) is refused at its next
write and stops: `Fenced` is raised and the caller abandons the job. A write that cannot
reach Redis is retried with backoff for `redis_wait_s` (Redis restarting), then given up.

Deltas are written behind: `delta` queues the entry and returns, and one writer thread
sends everything queued in one round trip (one APPEND per attempt, in a pipeline), so the
model never waits for Redis and a burst of tokens costs one round trip, not one per token.
With several slots, the job threads of one batch step publish within a millisecond of each
other: `linger_s` holds the round trip that long so it carries them all (measured at 8
streams: 1,158 APPENDs for 1,024 tokens without it; each round trip also wakes Redis and
the API, which on a CPU worker's machine take cores from the model).
What the writer learns comes back through the attempt: `fenced`, `cancelled`, or a write
error, raised by the attempt's next call. `started`, `finished`, `failed` and `flush` wait
until everything the attempt queued before them is written.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field

import redis
from redis.exceptions import NoScriptError

from contract import entries, keys, scripts
from contract.entries import Delta, Entry, Failed, Finished, Started

log = logging.getLogger("tokenspool.worker")

MAX_BATCH = 512  # entries per round trip
MAX_QUEUED = 8192  # entries waiting before `delta` blocks


class Fenced(Exception):
    """This attempt may not write to the job any more."""


class JobGone(Exception):
    """The job hash does not exist (expired, purged) or the job cannot start (ended, late)."""


@dataclass
class Attempt:
    """One worker's attempt at one job. `cancelled` turns true once a cancel is due;
    `fenced` once the heartbeat learns another attempt (or an END) took over."""

    completion_id: str
    epoch: int
    cancelled: bool = False
    fenced: bool = False
    progress_at: float = field(default_factory=time.monotonic)  # last token (or the claim)
    published: int = 0  # tokens this attempt wrote
    error: Exception | None = None  # a write failed for good: raised by the next call

    def check(self) -> None:
        """Raise what the writer learned: fenced out, or a write that failed."""
        if self.fenced:
            raise Fenced(f"{self.completion_id} epoch {self.epoch}: another attempt took over")
        if self.error is not None:
            raise self.error


@dataclass
class _Queued:
    attempt: Attempt
    entry: Entry | None  # None: a marker that only waits for what was queued before it
    written: threading.Event | None = None  # set once handled, for callers who wait


@dataclass(frozen=True)
class Progress:
    """What earlier attempts of a job already published."""

    prompt_tokens: int | None = None
    token_ids: tuple[int, ...] = ()
    deadline_ms: int | None = None  # the job's overall deadline, if it has one


class Publisher:
    def __init__(
        self,
        client: redis.Redis,
        worker_name: str,
        retention_s: int,
        window_ms: int,
        redis_wait_s: float = 15.0,
        linger_s: float = 0.0,
    ) -> None:
        self._client = client
        self.worker = worker_name
        self._retention = retention_s
        self._window_ms = window_ms
        self._redis_wait = redis_wait_s
        self._linger = linger_s
        self._claim = client.register_script(scripts.CLAIM)
        self._append = client.register_script(scripts.APPEND)
        self._end = client.register_script(scripts.END)
        self._queue: collections.deque[_Queued] = collections.deque()
        self._cv = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="publisher", daemon=True)
        self._writer.start()

    def claim(self, completion_id: str) -> Attempt:
        """Start a new attempt at a job (fencing out every earlier one)."""
        epoch, cancel = self._retry(
            lambda: self._claim(
                keys=[keys.job(completion_id), keys.RUNNING, keys.alive(completion_id)],
                args=[self.worker, completion_id, self._window_ms],
            )
        )
        if epoch <= 0:
            if epoch == 0:
                self.end_if_late(completion_id)
            raise JobGone(completion_id)
        return Attempt(completion_id=completion_id, epoch=int(epoch), cancelled=bool(cancel))

    def progress(self, completion_id: str) -> Progress:
        """Read back what earlier attempts published (token ids are the contract's truth)."""
        prompt_tokens = None
        ids: list[int] = []
        after = "-"
        stream = keys.events(completion_id)
        while True:
            rows = self._retry(lambda a=after: self._client.xrange(stream, min=a, count=1000))
            for _, fields in rows:
                entry = entries.decode(fields)
                if isinstance(entry, Started) and prompt_tokens is None:
                    prompt_tokens = entry.prompt_tokens
                elif isinstance(entry, Delta):
                    ids.extend(entry.token_ids)
            if len(rows) < 1000:
                deadline = self._retry(
                    lambda: self._client.hget(keys.job(completion_id), keys.JobField.DEADLINE)
                )
                return Progress(prompt_tokens, tuple(ids), int(deadline) if deadline else None)
            after = "(" + rows[-1][0].decode()

    def started(self, attempt: Attempt, prompt_tokens: int) -> None:
        self._submit(attempt, Started(attempt.epoch, self.worker, prompt_tokens), wait=True)

    def delta(self, attempt: Attempt, text: str, token_ids: tuple[int, ...]) -> None:
        """Queue generated text; returns at once (raises what an earlier write learned)."""
        self._submit(attempt, Delta(attempt.epoch, text, token_ids), wait=False)

    def finished(self, attempt: Attempt, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._submit(attempt, Finished(attempt.epoch, reason, prompt_tokens, completion_tokens), wait=True)

    def failed(self, attempt: Attempt, message: str, type_: str, code: str, param: str | None = None) -> None:
        self._submit(attempt, Failed(attempt.epoch, message, type_, code, param), wait=True)

    def flush(self, attempt: Attempt) -> None:
        """Wait until everything the attempt queued is written (raises what was learned)."""
        self._submit(attempt, None, wait=True)

    def count_tokens(self, model: str, attempt: Attempt) -> None:
        """Add the attempt's tokens to the cluster-wide counter (best effort: metrics only)."""
        if attempt.published:
            try:
                self._client.hincrby(keys.STATS, keys.StatField.tokens(model), attempt.published)
            except redis.RedisError as exc:
                log.warning("could not count tokens: %s", exc)

    def end(self, completion_id: str, entry: Failed | Finished, only_if_status: str = "") -> bool:
        """End a job that no attempt of ours holds (e.g. arguments that fail validation)."""
        return bool(
            self._retry(
                lambda: self._end(
                    keys=scripts.job_keys(completion_id),
                    args=scripts.end_args(completion_id, entry, self._retention, only_if_status),
                )
            )
        )

    def end_if_late(self, completion_id: str) -> None:
        attempts = int(self._client.hget(keys.job(completion_id), keys.JobField.ATTEMPTS) or 0)
        self.end(completion_id, scripts.late_error(attempts), only_if_status=keys.JobStatus.QUEUED)

    def _submit(self, attempt: Attempt, entry: Entry | None, wait: bool) -> None:
        attempt.check()
        item = _Queued(attempt, entry, threading.Event() if wait else None)
        with self._cv:
            while len(self._queue) >= MAX_QUEUED:  # Redis is slow: hold the model back
                self._cv.wait()
            self._queue.append(item)
            self._cv.notify_all()
        if item.written is not None:
            item.written.wait()
            attempt.check()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
            if self._linger:
                time.sleep(self._linger)  # let the rest of this step's tokens arrive
            with self._cv:
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
                self._cv.notify_all()
            try:
                self._write(batch)
            except Exception as exc:  # never let the writer die: the attempts get the error
                log.exception("publisher write failed")
                for item in batch:
                    item.attempt.error = item.attempt.error or exc
            finally:
                for item in batch:
                    if item.written is not None:
                        item.written.set()

    def _write(self, batch: list[_Queued]) -> None:
        """One round trip: each attempt's queued entries in one APPEND."""
        groups: dict[int, tuple[Attempt, list[Entry]]] = {}
        for item in batch:
            a = item.attempt
            if item.entry is not None and not a.fenced and a.error is None:
                groups.setdefault(id(a), (a, []))[1].append(item.entry)
        todo = list(groups.values())
        try:
            while todo:
                results = self._retry(lambda t=todo: self._append_all(t))
                missing = []
                for (attempt, sent), result in zip(todo, results, strict=True):
                    if isinstance(result, NoScriptError):
                        missing.append((attempt, sent))  # Redis restarted: load and resend
                    elif isinstance(result, redis.ResponseError):
                        if str(result).startswith(scripts.FENCED):
                            attempt.fenced = True
                        else:
                            attempt.error = result
                    else:
                        attempt.cancelled = attempt.cancelled or bool(result[1])
                        attempt.published += sum(len(e.token_ids) for e in sent if isinstance(e, Delta))
                if missing:
                    self._retry(lambda: self._client.script_load(scripts.APPEND))
                todo = missing
        except redis.RedisError as exc:  # Redis gone for longer than redis_wait_s
            for attempt, _ in todo:
                attempt.error = attempt.error or exc

    def _append_all(self, todo: list[tuple[Attempt, list[Entry]]]) -> list:
        with self._client.pipeline(transaction=False) as pipe:
            for attempt, sent in todo:
                cid = attempt.completion_id
                pipe.evalsha(
                    self._append.sha,
                    len(scripts.job_keys(cid)),
                    *scripts.job_keys(cid),
                    *scripts.append_args(cid, sent, self._retention),
                )
            return pipe.execute(raise_on_error=False)

    def _retry(self, call):
        """Run a Redis call, riding out a Redis restart or failover for up to redis_wait_s."""
        deadline = time.monotonic() + self._redis_wait
        delay = 0.05
        while True:
            try:
                return call()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("Redis unreachable (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
