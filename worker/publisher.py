"""Fenced writes of one attempt's entries to its job's stream.

Every write goes through the contract's Lua scripts, so a worker that is no longer the
current attempt (declared dead, job ended or cancelled elsewhere) is refused at its next
write and stops: `Fenced` is raised and the caller abandons the job.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from contract import keys, scripts
from contract.entries import Delta, Entry, Failed, Finished, Started


class Fenced(Exception):
    """This attempt may not write to the job any more."""


class JobGone(Exception):
    """The job hash does not exist (expired, purged) or the job has already ended."""


@dataclass
class Attempt:
    """One worker's attempt at one job; `cancelled` turns true once a cancel is due."""

    completion_id: str
    epoch: int
    cancelled: bool = False


class Publisher:
    def __init__(self, client: redis.Redis, worker_name: str, retention_s: int) -> None:
        self._client = client
        self._worker = worker_name
        self._retention = retention_s
        self._claim = client.register_script(scripts.CLAIM)
        self._append = client.register_script(scripts.APPEND)

    def claim(self, completion_id: str) -> Attempt:
        """Start a new attempt at a job (fencing out every earlier one)."""
        epoch, cancel = self._claim(keys=[keys.job(completion_id)], args=[self._worker])
        if epoch <= 0:
            raise JobGone(completion_id)
        return Attempt(completion_id=completion_id, epoch=int(epoch), cancelled=bool(cancel))

    def started(self, attempt: Attempt, prompt_tokens: int) -> None:
        self._write(attempt, Started(attempt.epoch, self._worker, prompt_tokens))

    def delta(self, attempt: Attempt, text: str, token_ids: tuple[int, ...]) -> None:
        self._write(attempt, Delta(attempt.epoch, text, token_ids))

    def finished(self, attempt: Attempt, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._write(attempt, Finished(attempt.epoch, reason, prompt_tokens, completion_tokens))

    def failed(self, attempt: Attempt, message: str, type_: str, code: str, param: str | None = None) -> None:
        self._write(attempt, Failed(attempt.epoch, message, type_, code, param))

    def _write(self, attempt: Attempt, entry: Entry) -> None:
        cid = attempt.completion_id
        try:
            _, cancel = self._append(
                keys=[keys.job(cid), keys.events(cid)],
                args=scripts.append_args(entry, self._retention),
            )
        except redis.ResponseError as exc:
            if str(exc).startswith(scripts.FENCED):
                raise Fenced(f"{cid} epoch {attempt.epoch}: {exc}") from None
            raise
        attempt.cancelled = attempt.cancelled or bool(cancel)
