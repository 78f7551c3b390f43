"""The worker's loop: take the model's jobs, one free slot at a time, through Redis outages.

RQ's SimpleWorker gives the worker its RQ registration (`rq:workers`, `rq info`), its
heartbeat and its signal handling. RQ's queues and job records carry the jobs (JSON
serializer, never pickle). The loop, the dequeue and the execution are tokenspool's own.
For two reasons:

- **Nothing in a job hash but its `data` is ever read**. RQ's execution path acts on a dozen
  fields of the hash, and dies on a malformed one. It imports and calls callbacks, requests
  webhooks, and enqueues dependents and retries. It acts on timeouts, TTLs and rate limits.
  Here a job's `data` must decode to exactly `[JOB_FUNCTION, None, [spec], {}]`. The spec
  then goes to the job runner, which checks it again. Anything else is refused: logged, and
  its record deleted. RQ's maintenance and pub/sub commands act on registries and channels
  that anyone with `rq:*` access can write. They are not run.
- **No job is lost between the queue and its claim**. `TAKE` moves a job id from the queues
  into this worker's inbox atomically. The reaper puts back the inbox of a worker that died
  before claiming. No Redis outage ends the loop either. Any connection error, at any step,
  is waited out (capped, jittered backoff, logged once per outage). The worker then
  registers with RQ again and goes on, with the same process and the model still loaded. A
  Redis too full to take the loop's writes is waited out too. With maxmemory and
  noeviction, it refuses RQ's heartbeat. The running jobs go on meanwhile. They end
  `storage_full` if their own entries are refused (worker/attempts/rules.py).

A worker holds up to SLOTS jobs. It takes a job only once a slot is free. So waiting jobs
stay in the queue, where any worker can take them. Within each tier it first takes the jobs
the API routed to it. Their prompt's prefix is in its cache (api/jobs/routing.py). Then it
takes from the tier's shared queue. Suspects are jobs that stood still where their workers
died. From its model's suspect queue, it takes those that may step as one group with the
suspects it runs. A suspect that died in a group of them steps in groups half as large after
(api/cluster/reaper.py). One is cleared once it goes SUSPECT_TOKENS past where it died
(worker/attempts/rules.py). From its batch queue (the Batch API's lines) it takes only into
its BATCH_SLOTS. While interactive jobs are quiet, it takes into more slots
(worker/intake/lending.py). A lent slot is called back by preempting a batch line when an
interactive job waits.
On SIGTERM the loop stops taking jobs. The job runner finishes the running ones within the
shutdown grace period, or hands them off. A second signal hands them off at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import time
import zlib

import redis
from redis.exceptions import OutOfMemoryError
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import SimpleWorker

from contract import keys, queueing, tiers
from contract.entries import as_text
from contract.keys import JOB_FUNCTION
from contract.lua import queues
from worker.attempts.runner import JobRunner
from worker.intake.lending import Lending
from worker.redis.outage import Outage
from worker.redis.retrying import TRANSIENT

log = logging.getLogger(__name__)

# bytes of (inflated) job data: a spec is far smaller
MAX_JOB_DATA = 1 << 20
# RQ's own rule, with a length cap
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
# how long an idle loop blocks for new jobs before it looks around again
BLOCK_S = 1
# RQ would set dequeue timeout + 10 s (7 minutes) on the connection
SOCKET_TIMEOUT_S = 10.0
# RQ's worker key lives 480 s; this also finds a Redis that forgot us
RQ_HEARTBEAT_S = 5.0


class ForbiddenJob(Exception):
    """A job this worker will not run: anything but JOB_FUNCTION(spec)."""


def job_spec(data: bytes | None) -> dict:
    """The spec argument of an RQ job's `data`. A worker reads no other field of its hash."""
    if data is None:
        raise ForbiddenJob("no job data")
    if len(data) > MAX_JOB_DATA:
        raise ForbiddenJob("job data too large")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(data, MAX_JOB_DATA + 1)
        if len(raw) > MAX_JOB_DATA or inflater.unconsumed_tail:
            raise ForbiddenJob("job data too large")
    except zlib.error:
        # RQ stores small data uncompressed
        raw = data
    try:
        func, instance, args, kwargs = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ForbiddenJob(f"undecodable job data: {exc}") from None
    if func != JOB_FUNCTION or instance is not None or kwargs not in ({}, None):
        raise ForbiddenJob(f"refusing to run {func!r}: only {JOB_FUNCTION}(spec) is allowed")
    if not isinstance(args, list) or len(args) != 1 or not isinstance(args[0], dict):
        raise ForbiddenJob(f"{JOB_FUNCTION} takes one spec object")
    return args[0]


class TokenspoolWorker(SimpleWorker):
    def __init__(
        self, model: str, name: str, connection: redis.Redis, runner: JobRunner, lending: Lending
    ) -> None:
        names = tiers.worker_queue_names(model, name)
        rq_queues = [Queue(n, connection=connection, serializer=JSONSerializer) for n in names]
        # prepare_for_work=False: nothing is sent to Redis here (it may be down at start)
        super().__init__(
            rq_queues, name=name, connection=connection, serializer=JSONSerializer, prepare_for_work=False
        )
        connection.connection_pool.connection_kwargs["socket_timeout"] = SOCKET_TIMEOUT_S
        self.hostname, self.pid = socket.gethostname(), os.getpid()
        self._model = model
        self._runner = runner
        self._lending = lending
        self._take = connection.register_script(queues.TAKE)
        # the primary's word only
        self._taken_data = connection.register_script(queues.TAKEN_DATA)
        self._outage = Outage("worker loop")
        self._registered = False
        self._beat_at = 0.0
        # job ids taken by this process (an inbox left over is not)
        self._handled: set[str] = set()
        # after a start or an outage: adopt ids whose TAKE reply was lost
        self._check_inbox = True
        routed = {p: keys.rq_queue_key(tiers.routed_queue_name(model, p, name)) for p in tiers.ROUTED_TIERS}
        # its routed queues' tiers
        self._routed = {queue: tier for tier, queue in routed.items()}
        # the last take was a suspect's: its group may grow
        self._forming = False
        runner.queue_opened = self._queue_opened

    # RQ's pub/sub commands would let anyone who may PUBLISH on rq:* stop or shut down workers.
    def subscribe(self) -> None:
        self.pubsub = None

    def unsubscribe(self) -> None:
        pass

    def request_stop(self, signum, frame) -> None:
        """SIGTERM or Ctrl-C: stop taking jobs. It raises no exception from inside a Redis
        call or a claim. The runner finishes or hands off the running ones. A second signal:
        now."""
        log.info("stopping: no new jobs; running jobs finish or are handed off")
        self._stop_requested = True
        self._shutdown_requested_date = self._shutdown_requested_date or now()
        self._runner.request_shutdown()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.request_force_stop)

    def request_force_stop(self, signum, frame) -> None:
        self._runner.request_shutdown(0.0)
        super().request_force_stop(signum, frame)

    def work(self, max_idle_time: float | None = None) -> None:  # type: ignore[override]
        """Take jobs until asked to stop, or idle for `max_idle_time` seconds."""
        self._install_signal_handlers()
        try:
            while not self._stop_requested:
                try:
                    if self._serve_once(max_idle_time):
                        log.info("no job for %d s: exiting (scale to zero)", max_idle_time)
                        return
                    self._outage.ok()
                # a full Redis too: its jobs go on
                except (*TRANSIENT, OutOfMemoryError) as exc:
                    self._registered = False
                    self._check_inbox = True
                    self._pause(self._outage.failed(exc))
        finally:
            if self._registered:
                with contextlib.suppress(redis.RedisError):
                    self.register_death()

    def _serve_once(self, max_idle_time: float | None) -> bool:
        """One step of the loop. True when the worker has been idle long enough to leave."""
        self._register()
        if self._check_inbox:
            self._adopt_inbox()
        runner = self._runner
        lent = self._lending.lent(runner.running_batch_lines())
        if not runner.reserve(timeout=self._lending.poll_s if lent else BLOCK_S):
            # every slot busy, one of them lent: make room for an interactive job that waits
            if lent and (waiting := self._lending.call_back()) and (victim := runner.preempt_batch_line()):
                # lend nothing until interactive jobs are quiet
                self._lending.interactive_started()
                log.info("preempting batch line %s for %s", victim, waiting)
            # every slot busy: the jobs stay in the queue, where any worker can take them
            return False
        try:
            taken = self._take_one()
        except BaseException:
            runner.unreserve()
            raise
        if taken is None:
            runner.unreserve()
            return max_idle_time is not None and runner.idle_for() >= max_idle_time
        self._execute(*taken)
        return False

    def _register(self) -> None:
        """Register with RQ at start. Register again whenever Redis has forgotten us (a
        restart without persistence). Register again, too, when we lost Redis for a while.
        After an outage, a restart with persistence still holds our own old record."""
        now = time.monotonic()
        if self._registered and now - self._beat_at >= RQ_HEARTBEAT_S:
            self._registered = bool(self.connection.exists(self.key))
            if self._registered:
                self.heartbeat()
            self._beat_at = now
        if not self._registered:
            # ours: worker names are unique per process
            self.connection.delete(self.key)
            self.register_birth()
            self.set_state("idle")
            self._registered, self._beat_at = True, now

    def _queues(self) -> list[str]:
        """The queues to take from now. The batch queue is left out while the batch slots are
        full. The other slots stay for interactive jobs, or are lent and called back
        (worker/intake/lending.py). Suspects are taken as one group, one take after another.
        A group holds as many as the least group of theirs allows. A group forms when the
        continuations read again here have had their turn since the last one
        (worker/attempts/proofs.py). A group's proof holds those continuations up. The group
        closes at the first take of anything else. So a stream of suspects never holds up
        the jobs reading here for long."""
        names = tiers.worker_queue_names(self._model, self.name)
        suspects, cap = self._runner.running_suspects()
        forms = self._runner.proof_may_start()
        if not (forms or (self._forming and suspects and (not cap or suspects < cap))):
            names = tuple(n for n in names if n != tiers.suspect_queue_name(self._model))
        lines = self._runner.running_batch_lines()
        if lines >= self._lending.batch_limit(interactive_running=self._runner.running() > lines):
            names = tuple(n for n in names if n != tiers.queue_name(self._model, tiers.BATCH))
        return list(names)

    def _take_one(self) -> tuple[str, str] | None:
        """Move one job id from the queues into this worker's inbox. It waits up to BLOCK_S
        for one to be enqueued. Returns the id and its owner (as its RQ record says). None
        once asked to stop. Else a signal during the wait would take the continuation that
        this worker's own hand-off just enqueued."""
        if self._stop_requested:
            return None
        got = self._take_from(self._queues())
        if not got:
            # a group of suspects closes when none waits
            self._forming = False
            self.connection.blpop([keys.wake(self._model), keys.wake_worker(self.name)], timeout=BLOCK_S)
            if self._stop_requested:
                return None
            # the queues again: a line that ended meanwhile lets the batch queue back in
            got = self._take_from(self._queues())
            if not got:
                return None
        job_id, queue = as_text(got[1]), as_text(got[0])
        self._forming = queue == keys.rq_queue_key(tiers.suspect_queue_name(self._model))
        self._handled.add(job_id)
        if queue in self._lending.interactive_queues:
            self._lending.interactive_started()
        if tier := self._routed.get(queue):
            # the router sent it here, and it is taken here
            self._runner.counters.routed_taken += 1
            # else the reaper drops it at its deadline
            with contextlib.suppress(redis.RedisError):
                queueing.routed_taken(self.connection, self._model, job_id, self.name, tier)
        return job_id, as_text(got[2])

    def _take_from(self, names: list[str]) -> list | None:
        """TAKE: the first job waiting in `names`, in order. Of the suspects, it takes the
        first that may step beside those running here. On an embedding worker, it takes the
        oldest of the key with the fewest jobs running here. In the guest slot it takes only
        another key's (contract.lua.queues.TAKE)."""
        suspects, _ = self._runner.running_suspects()
        owners, guest = self._runner.turns() or (None, False)
        args = queues.take_args(names, tiers.suspect_queue_name(self._model), suspects, owners, guest)
        return self._take(keys=queues.take_keys(names, self.name), args=args)

    def _queue_opened(self) -> None:
        """Wake this loop to take the next job now, not at the next job enqueued. A Batch API
        line ended, or a suspect ended or was cleared. Or a job ended beside the guest slot
        (on its job thread). The loop may be blocked waiting with the batch or suspect queue
        left out. Or it may wait for another key's job only."""
        wake = keys.wake_worker(self.name)
        with contextlib.suppress(redis.RedisError), self.connection.pipeline(transaction=False) as pipe:
            pipe.lpush(wake, 1)
            # one token wakes it; more would spin
            pipe.ltrim(wake, 0, 0)
            pipe.expire(wake, 60)
            pipe.execute()

    def _adopt_inbox(self) -> None:
        """Run the ids in this worker's inbox that it never saw (a TAKE whose reply was lost
        in an outage). Nobody else will, as long as this worker is alive."""
        for raw in self.connection.hkeys(keys.inbox(self.name)):
            job_id = as_text(raw)
            if job_id in self._handled or not self._runner.reserve(timeout=0):
                continue
            self._handled.add(job_id)
            self._execute(job_id)
        self._check_inbox = False

    def _execute(self, job_id: str, owner: str = "") -> None:
        """Hand the job to the runner, which claims it in the slot reserved for it. Or refuse
        it. Then take it out of the inbox and delete RQ's record of it."""
        try:
            if not JOB_ID.fullmatch(job_id):
                raise ForbiddenJob("not an RQ job id")
            data = self._taken_data(keys=[keys.rq_job(job_id)])
            # the job ended while queued (or was deleted): nothing to run
            if data is None:
                self._runner.unreserve()
                log.info("job %s is gone (it ended while queued)", job_id)
                self._settle(job_id)
                return
            spec = job_spec(data)
        except ForbiddenJob as exc:
            self._runner.unreserve()
            log.warning("refused job %r: %s", job_id, exc)
            self._settle(job_id)
            return
        except BaseException:
            self._runner.unreserve()
            raise
        try:
            # gives the slot back itself if it starts nothing
            self._runner.start(spec, job_id, owner)
        except TRANSIENT:
            # the job stays in the inbox: adopted again once Redis is back
            raise
        except Exception:
            log.exception("could not start job %r", job_id)
        self._settle(job_id)

    def _settle(self, job_id: str) -> None:
        """Forget the job: its inbox entry and RQ's record of it. A refused job's record is
        deleted too, and the log says why. It waits out an outage, as the job has been handled."""
        while True:
            try:
                with self.connection.pipeline(transaction=True) as pipe:
                    pipe.hdel(keys.inbox(self.name), job_id)
                    if JOB_ID.fullmatch(job_id):
                        pipe.delete(keys.rq_job(job_id))
                    pipe.execute()
                return
            except TRANSIENT as exc:
                if self._stop_requested and self._runner.running() == 0:
                    # leaving: the reaper puts back what the inbox still holds
                    return
                self._pause(self._outage.failed(exc))

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))
