"""Fenced writes of attempts' entries to their jobs' streams, off the generating thread.

Every write goes through the contract's Lua scripts. A worker may no longer be the current
attempt: declared dead, or its job ended or cancelled elsewhere. Then it is refused at its
next write, and stops. `Fenced` is raised and the caller abandons the job. A write that
cannot reach Redis is retried with backoff for `redis_wait_s` (Redis restarting), then given
up.

Deltas are written behind. `delta` queues the entry and returns. One writer thread sends
everything queued in one round trip (one APPEND per attempt, in a pipeline). So the model
never waits for Redis. A burst of tokens costs one round trip, not one per token. With
several slots, the job threads of one batch step publish within a millisecond of each other.
`linger_s` holds the round trip that long, so it carries them all. Each round trip also wakes
Redis and the API. On a CPU worker's machine they take cores from the model
(docs/benchmarks.md). It holds only while `crowded()` says other attempts run. A lone attempt
has nobody to wait for, and the linger would only delay its first token. What the writer
learns comes back through the attempt: `fenced`, `cancelled`, or a write error. The attempt's
next call raises it. `started`, `finished`, `failed` and `flush` wait until everything the
attempt queued before them is written.

A failover can take back the last writes (docs/protocol.md, "Failover"). Each attempt holds
what it wrote until a replica has it (`Attempt.record`, worker/attempts/durability.py). A write
may find the job behind (`BEHIND n`). Then it first writes the lost entries again, with the
stream ids they had. So the stream reads as it did. `resend` does the same for an attempt with
nothing more to write. That is an attempt that has ended, or one whose heartbeat found its
claim lost.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from redis.exceptions import NoScriptError

from contract import keys, stats
from contract.entries import CallPart, Delta, Entry, Finished, Started, TokenLogprob, is_terminal
from contract.errors import ErrorCode
from contract.lua import attempts, jobs, library
from contract.servers import is_cluster
from contract.stats import BatchCounters
from worker.attempts.attempt import Attempt, RolledBack
from worker.redis.link import Link

log = logging.getLogger(__name__)

# entries per round trip
MAX_BATCH = 512
# entries waiting before `delta` blocks
MAX_QUEUED = 8192


@dataclass
class _Queued:
    attempt: Attempt
    # None: a marker that only waits for what was queued before it
    entry: Entry | None
    # set once handled, for callers who wait
    written: threading.Event | None = None
    # write again what the attempt holds (a failover may have lost it)
    resend: bool = False


class Publisher:
    def __init__(
        self,
        link: Link,
        linger_s: float = 0.0,
        crowded: Callable[[], bool] = lambda: True,
        counters: BatchCounters | None = None,
        holding: bool = True,
    ) -> None:
        self._link = link
        # keep what was written in `Attempt.record` (worker/attempts/durability.py)
        self._holding = holding
        # publish_us, publishes
        self._counters = counters if counters is not None else BatchCounters()
        self._client = link.streams
        self._linger = linger_s
        self._crowded = crowded
        self._append = link.streams.register_script(attempts.APPEND)
        # One server: a round trip's APPENDs in one MULTI/EXEC, so Redis wakes a blocked
        # reader (the API's XREAD over every stream) once, with every stream's entries, and
        # not once for the first APPEND and again for the rest. A cluster cannot run one
        # transaction across slots.
        self._together = not is_cluster(link.streams)
        self._queue: collections.deque[_Queued] = collections.deque()
        self._cv = threading.Condition()
        self._writer = threading.Thread(target=self._write_loop, name="publisher", daemon=True)
        self._writer.start()

    def started(
        self, attempt: Attempt, prompt_tokens: int, after: str = "", cleared: tuple[int, int] = (0, 0)
    ) -> None:
        """The attempt's first entry, going on from entry `after` (what it read). It carries
        what the job's context edit cleared: (tool uses, input tokens)."""
        uses, tokens = cleared
        entry = Started(
            epoch=attempt.epoch,
            worker=self._link.worker,
            prompt_tokens=prompt_tokens,
            after=after,
            cleared_tool_uses=uses,
            cleared_input_tokens=tokens,
        )
        self._submit(attempt, entry, wait=True)

    def delta(
        self,
        attempt: Attempt,
        text: str,
        token_ids: tuple[int, ...],
        calls: tuple[CallPart, ...] = (),
        logprobs: tuple[TokenLogprob, ...] = (),
        reasoning: str = "",
    ) -> None:
        """Queue generated text and return at once. It raises what an earlier write learned."""
        entry = Delta(
            epoch=attempt.epoch,
            text=text,
            token_ids=token_ids,
            calls=calls,
            logprobs=logprobs,
            reasoning=reasoning,
        )
        self._submit(attempt, entry, wait=False)

    def finished(
        self,
        attempt: Attempt,
        reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        reasoning_tokens: int = 0,
        stop_sequence: str = "",
        vectors: bytes = b"",
        dimensions: int = 0,
    ) -> None:
        entry = Finished(
            epoch=attempt.epoch,
            finish_reason=reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            reasoning_tokens=reasoning_tokens,
            stop_sequence=stop_sequence,
            vectors=vectors,
            dimensions=dimensions,
        )
        attempt.trace.publishing(cached_tokens)
        self._submit(attempt, entry, wait=True)
        attempt.trace.published()

    def failed(
        self, attempt: Attempt, error: ErrorCode, message: str | None = None, param: str | None = None
    ) -> None:
        self._submit(attempt, error.entry(message, param, epoch=attempt.epoch), wait=True)

    def flush(self, attempt: Attempt) -> None:
        """Wait until everything the attempt queued is written (raises what was learned)."""
        self._submit(attempt, None, wait=True)

    def resend(self, attempt: Attempt, wait: bool = True) -> None:
        """Write again, with their ids, the entries of `attempt` a failover may have lost. This
        holds for an ended attempt too. With `wait`, return once that is done. What is still
        there is skipped."""
        item = _Queued(attempt, None, threading.Event(), resend=True)
        with self._cv:
            self._queue.append(item)
            self._cv.notify_all()
        if wait:
            item.written.wait()  # type: ignore[union-attr]

    def count_tokens(self, model: str, attempt: Attempt) -> None:
        """Add the attempt's tokens to the cluster-wide counter (best effort: metrics only)."""
        if attempt.published:
            try:
                self._link.client.hincrby(keys.STATS, stats.StatField.tokens(model), attempt.published)
            except redis.RedisError as exc:
                log.warning("could not count tokens: %s", exc)

    def _submit(self, attempt: Attempt, entry: Entry | None, wait: bool) -> None:
        attempt.check()
        item = _Queued(attempt, entry, threading.Event() if wait else None)
        with self._cv:
            # Redis is slow: hold the model back
            while len(self._queue) >= MAX_QUEUED:
                self._cv.wait()
            self._queue.append(item)
            self._cv.notify_all()
        if item.written is not None:
            item.written.wait()
            # A written end fences its own attempt, and a beat may learn it first: no news.
            if not (attempt.ended and entry is not None and is_terminal(entry)):
                attempt.check()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
            if self._linger and self._crowded():
                # let the rest of this step's tokens arrive
                time.sleep(self._linger)
            with self._cv:
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
                self._cv.notify_all()
            started = time.perf_counter()
            try:
                self._write(batch)
            # never let the writer die: the attempts get the error
            except Exception as exc:
                log.exception("publisher write failed")
                for item in batch:
                    item.attempt.error = item.attempt.error or exc
            finally:
                self._counters.publish_us += int((time.perf_counter() - started) * 1e6)
                self._counters.publishes += 1
                for item in batch:
                    if item.written is not None:
                        item.written.set()

    def _write(self, batch: list[_Queued]) -> None:
        """One round trip: each attempt's queued entries in one APPEND, after what a failover
        lost of it."""
        groups: dict[int, _Group] = {}
        for item in batch:
            a = item.attempt
            if a.fenced or a.error is not None:
                continue
            if item.entry is not None or item.resend:
                group = groups.setdefault(id(a), _Group(a, a.written))
                if item.entry is not None:
                    group.new.append(item.entry)
                if item.resend:
                    group.resend_from(a.record[0][0] if a.record else a.written)
        todo = [g for g in groups.values() if g.new or g.again is not None]
        try:
            while todo:
                results = self._link.retry(lambda t=todo: self._append_all(t))
                again = []
                for group, result in zip(todo, results, strict=True):
                    attempt = group.attempt
                    if isinstance(result, NoScriptError):
                        # Redis restarted: load and resend
                        again.append(group)
                    elif isinstance(result, redis.ResponseError):
                        message = str(result)
                        if message.startswith(attempts.FENCED):
                            attempt.move("fence")
                        elif message.startswith(attempts.BEHIND):
                            lost_from = int(message.split()[1])
                            log.warning(
                                "%s: a failover lost entries %d-%d of attempt %d; writing them again",
                                attempt.job_id,
                                lost_from,
                                attempt.written - 1,
                                attempt.epoch,
                            )
                            if group.resend_from(lost_from):
                                again.append(group)
                            else:
                                attempt.error = RolledBack(
                                    f"{attempt.job_id}: a failover lost entries from {lost_from}, "
                                    "which this worker no longer holds (a replica had confirmed them)"
                                )
                        else:
                            attempt.error = result
                    else:
                        group.done(result, self._holding)
                if any(isinstance(r, NoScriptError) for r in results):
                    self._link.retry(lambda: self._client.script_load(attempts.APPEND))
                todo = again
        # Redis gone for longer than the link's redis_wait_s
        except redis.RedisError as exc:
            for group in todo:
                group.attempt.error = group.attempt.error or exc

    def _append_all(self, todo: list[_Group]) -> list:
        """One pipeline of APPENDs (one transaction on one server). Each numbers its entries
        from its first. So resending the pipeline after a lost reply writes nothing twice."""
        with self._client.pipeline(transaction=self._together) as pipe:
            for group in todo:
                job_id = group.attempt.job_id
                job_keys = library.job_keys(job_id)
                # execute_command: a cluster pipeline refuses `evalsha` (a script could touch
                # keys of several slots), but runs EVALSHA on the node it is given; APPEND's
                # keys share one slot. Named here, since redis-py would ask its default node
                # for the keys (COMMAND GETKEYS) and never replace it if it is the primary
                # that died in a failover; the node is looked up again at each retry.
                args = attempts.append_args(
                    job_id, group.attempt.claim, group.first, group.rows(), self._link.recovery.retention_s
                )
                where: dict[str, object] = {}
                if not self._together:
                    where["target_nodes"] = self._client.get_node_from_key(job_keys[0])  # type: ignore[attr-defined]
                pipe.execute_command("EVALSHA", self._append.sha, len(job_keys), *job_keys, *args, **where)
            return pipe.execute(raise_on_error=False)


class _Group:
    """One attempt's APPEND in a round trip. First come entries written again (with their ids)
    after a failover lost them. Then come its new ones."""

    def __init__(self, attempt: Attempt, first: int) -> None:
        self.attempt = attempt
        # the attempt's number of the first entry sent
        self.first = first
        self.again: list[tuple[str, Entry]] | None = None
        self.new: list[Entry] = []
        # the new entries', chosen once: a retry writes the same
        self.ids: list[str] | None = None

    def resend_from(self, seq: int) -> bool:
        """Send the held entries from number `seq` on before the new ones. False if some of
        them are no longer held."""
        held = self.attempt.held_from(seq)
        if held is None:
            return False
        self.first, self.again = min(seq, self.attempt.written), held
        return True

    def rows(self) -> list[tuple[str, Entry]]:
        if self.ids is None:
            self.ids = self.attempt.next_ids(len(self.new))
        return [*(self.again or []), *zip(self.ids, self.new, strict=True)]

    def done(self, result: list, holding: bool) -> None:
        """APPEND wrote (or had written) every entry: record the new ones with their ids. With
        `holding`, keep them until worker/attempts/durability.py finds them safe."""
        attempt = self.attempt
        if result[0] and not attempt.cancelled:
            attempt.move("cancel")
        ids = [x.decode() if isinstance(x, bytes) else str(x) for x in result[1:]]
        again = len(self.again or [])
        base = self.first + again
        if holding:
            attempt.wrote([(base + n, ids[again + n], e) for n, e in enumerate(self.new)])
        attempt.written = max(attempt.written, self.first + again + len(self.new))
        before = attempt.published
        attempt.published += sum(len(e.token_ids) for e in self.new if isinstance(e, Delta))
        if attempt.published and not before:
            attempt.trace.first_written()
        if not attempt.ended and any(jobs.final_status(e) for e in self.new):
            attempt.move("end")
        if ids:
            attempt.saw(ids[-1])
        self.again, self.new, self.ids = None, [], None
