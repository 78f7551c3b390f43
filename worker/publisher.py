"""Fenced writes of one attempt's entries to its job's stream.

Every write goes through the contract's Lua scripts, so a worker that is no longer the
current attempt (declared dead, job ended or cancelled elsewhere) is refused at its next
write and stops: `Fenced` is raised and the caller abandons the job. A write that cannot
reach Redis is retried with backoff for `redis_wait_s` (Redis restarting), then given up.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis

from contract import entries, keys, scripts
from contract.entries import Delta, Entry, Failed, Finished, Started

log = logging.getLogger("tokenspool.worker")


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


@dataclass(frozen=True)
class Progress:
    """What earlier attempts of a job already published."""

    prompt_tokens: int | None = None
    token_ids: tuple[int, ...] = ()


class Publisher:
    def __init__(
        self,
        client: redis.Redis,
        worker_name: str,
        retention_s: int,
        window_ms: int,
        redis_wait_s: float = 15.0,
    ) -> None:
        self._client = client
        self.worker = worker_name
        self._retention = retention_s
        self._window_ms = window_ms
        self._redis_wait = redis_wait_s
        self._claim = client.register_script(scripts.CLAIM)
        self._append = client.register_script(scripts.APPEND)
        self._end = client.register_script(scripts.END)

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
                return Progress(prompt_tokens, tuple(ids))
            after = "(" + rows[-1][0].decode()

    def started(self, attempt: Attempt, prompt_tokens: int) -> None:
        self._write(attempt, Started(attempt.epoch, self.worker, prompt_tokens))

    def delta(self, attempt: Attempt, text: str, token_ids: tuple[int, ...]) -> None:
        self._write(attempt, Delta(attempt.epoch, text, token_ids))
        attempt.published += len(token_ids)

    def count_tokens(self, model: str, attempt: Attempt) -> None:
        """Add the attempt's tokens to the cluster-wide counter (best effort: metrics only)."""
        if attempt.published:
            try:
                self._client.hincrby(keys.STATS, keys.StatField.tokens(model), attempt.published)
            except redis.RedisError as exc:
                log.warning("could not count tokens: %s", exc)

    def finished(self, attempt: Attempt, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._write(attempt, Finished(attempt.epoch, reason, prompt_tokens, completion_tokens))

    def failed(self, attempt: Attempt, message: str, type_: str, code: str, param: str | None = None) -> None:
        self._write(attempt, Failed(attempt.epoch, message, type_, code, param))

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

    def _write(self, attempt: Attempt, entry: Entry) -> None:
        cid = attempt.completion_id
        try:
            _, cancel = self._retry(
                lambda: self._append(
                    keys=scripts.job_keys(cid), args=scripts.append_args(cid, entry, self._retention)
                )
            )
        except redis.ResponseError as exc:
            if str(exc).startswith(scripts.FENCED):
                attempt.fenced = True
                raise Fenced(f"{cid} epoch {attempt.epoch}: {exc}") from None
            raise
        attempt.cancelled = attempt.cancelled or bool(cancel)

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
