"""Finds dead attempts and gives their jobs to another worker, whether a client is attached or not.

It also makes sure no job is left where nobody will run it.

Every API process runs a reaper. A Redis lock lets only one act at a time. Each tick it looks
at the running attempts (each shard's `running` index). It declares one dead when its
heartbeat key has expired: a hung or frozen worker. It also declares one dead when none of its
worker's named connections is left. That is a killed process, whose sockets the kernel closes
at once. A dead attempt's job is requeued as a continuation, or ends with worker_lost. This
does not wait for RQ's own maintenance (every 600 s) or its job_timeout + 60 s rule.

Whom a death is charged to. A worker that dies kills every job in its batch, and most of them
are bystanders. Charging each would let a job that kills every worker it lands on use up
innocent jobs' MAX_ATTEMPTS. A pool of preemptible GPUs would do the same. Isolating each (as
a suspect that runs alone) would serialise a 32-slot batch behind every death. A storm of
deaths would then stall the pool. What tells them apart is progress. A job that kills where
it stands dies there again, while a bystander goes on between deaths. So each dead attempt is
judged by what it wrote (contract.lua.jobs.ABANDON). One that went SUSPECT_TOKENS on is
cleared of any charge or suspicion, and simply requeued. One that stood still counts a stall.
It is charged only when it ran alone or was its worker's only suspect. It becomes a suspect at
its second stall in a row in a batch (a lone job at its first). A death while suspects run is
theirs. The others' stalls are not counted: they waited out their steps.

A worker's suspects step as one group beside the streams that decode, apart from the jobs
still reading (worker/engine/steps/plan.py). A job that kills where it stands kills before it
goes on, so a death then is the suspects'. The group steps until each suspect has generated
SUSPECT_TOKENS past where it died. Then each is cleared, and its charges with it.
MAX_ATTEMPTS counts deaths in a row where a job stands. A death among g suspects is group
testing's failed test. None is charged. Each may step in groups of ceil(g / 2) at most
after (worker/intake/rqworker.py takes no more). So a job that kills where it stands is alone
after log2(g) such deaths. Its mates clear at their first proof without it. It thus ends as
worker_lost after at most MAX_ATTEMPTS + 3 + ceil(log2(SLOTS)) deaths. Those are one going on
from its start, two stalls in batches, its groups halving, then MAX_ATTEMPTS alone. The jobs
batched with it finish. MAX_REQUEUES bounds the requeues standing still of every job. A
bystander that keeps going on is never failed while the pool can run it. Its length bounds
its requeues.

It also puts back the jobs a dead worker took from its queues but never claimed (its inbox).
It moves routed jobs back to the shared queues when their worker did not take them in time.
So too when their worker died with them. Some jobs are left pending by an API process or
worker that died between recording a job and enqueueing it. It enqueues them after
`PENDING_GRACE_S`. Every `FORGET_EVERY_S` it drops the workers that stopped announcing
themselves. Nothing is judged for `settle_s` after a Redis (re)start or failover, of either
server. Workers first reconnect, beat again and write again what the failover lost
(worker/attempts/durability.py).
"""

from __future__ import annotations

import collections
import json
import logging
import time

import redis.asyncio as aredis

from api.http import tracing
from api.jobs.routing import Router
from api.jobs.state import RunningAttempt
from api.jobs.store import JobStore
from api.jobs.workers import WorkerRegistry
from api.tasks import Background, Leader, every
from contract import keys, tiers
from contract.servers import Servers, node_infos

log = logging.getLogger(__name__)

FORGET_EVERY_S = 10.0
# an enqueue takes milliseconds; one pending this long lost its enqueuer
PENDING_GRACE_S = 3.0


class Reaper:
    def __init__(
        self,
        servers: Servers[aredis.Redis],
        store: JobStore,
        registry: WorkerRegistry,
        router: Router,
        interval_s: float,
        settle_s: float,
    ) -> None:
        self._servers = servers
        # where the workers' named connections are seen
        self._r = client = servers.queues
        self._store = store
        self._registry = registry
        self._router = router
        self._interval = interval_s
        # after a Redis restart, let workers reconnect and beat first
        self._settle = settle_s
        self._leader = Leader(client, keys.REAPER_LOCK)
        self._task = Background("reaper", lambda: every(self._interval, self.tick, "reaper"))
        # monotonic
        self._forget_at = 0.0
        # the servers' (nodes') run ids at the last tick
        self._run_ids: set[str] | None = None
        # monotonic: no reaping before, after a server changed
        self._quiet_until = 0.0

    async def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def tick(self) -> int:
        """One look around. Returns how many attempts were taken from dead workers."""
        lock_ms = int(max(self._interval * 4, 1.0) * 1000)
        # every process watches: a new leader knows the history
        settled = await self._settled()
        if not await self._leader.held(lock_ms) or not settled:
            return 0
        connected = {
            c.get("name", "")[len(keys.WORKER_CONNECTION_PREFIX) :]
            for c in await self._r.client_list()
            if c.get("name", "").startswith(keys.WORKER_CONNECTION_PREFIX)
        }
        survey = await self._store.survey(int(PENDING_GRACE_S * 1000))
        taken = await self._judge(survey.running, connected)
        await self._return_inboxes(connected)
        await self._route_back(connected)
        await self._enqueue_pending(survey.pending)
        if time.monotonic() >= self._forget_at:
            self._forget_at = time.monotonic() + FORGET_EVERY_S
            await self._registry.forget_silent()
        return taken

    async def _settled(self) -> bool:
        """No server (re)started within `settle_s`, and none changed. A failover promotes a
        replica that has run for long, so a change is checked too. The workers have
        reconnected and beaten since."""
        run_ids = set()
        young = False
        for server in self._servers.each():
            for info in await node_infos(server, "server"):
                run_ids.add(str(info.get("run_id")))
                young = young or int(info.get("uptime_in_seconds", 0)) < self._settle
        # a failover; or this process's first look, which cannot tell
        if run_ids != self._run_ids:
            if self._run_ids is not None:
                log.warning("a Redis server changed (a failover): no reaping for %.0fs", self._settle)
            self._quiet_until = time.monotonic() + self._settle
        self._run_ids = run_ids
        return not young and time.monotonic() >= self._quiet_until

    async def _judge(self, running: list[RunningAttempt], connected: set[str]) -> int:
        holding = collections.Counter(a.worker for a in running)
        suspects = collections.Counter(a.worker for a in running if a.suspect)
        dead: dict[str, list[RunningAttempt]] = collections.defaultdict(list)
        for a in running:
            gone = bool(a.worker) and a.worker not in connected
            if gone or not a.beating:
                dead[a.worker].append(a)
        taken = 0
        for worker, attempts in dead.items():
            batch, group = await self._store.dead_batch(worker, holding[worker], suspects[worker])
            for a in attempts:
                # alone or its worker's only suspect: its death, if it stood still; the
                # others' stalls count unless a suspect explains the death
                charge = batch <= 1 or (a.suspect and group <= 1)
                after = 1 if charge else 0 if group else 2
                traced = await self._traced(a.job_id) if tracing.tracing_on() else ""
                done = await self._store.abandon(
                    a.job_id, a.epoch, charge=charge, suspect_after=after, group=group if a.suspect else 0
                )
                if done.outcome in (1, 2):
                    taken += 1
                    why = "heartbeat expired" if a.worker in connected else "connection gone"
                    tracing.attempt_lost(traced, a.job_id, a.epoch, a.worker, why)
                    log.warning(
                        "attempt %d of %s on %s (batch of %d) is dead (%s); %s%s%s",
                        a.epoch,
                        a.job_id,
                        a.worker,
                        batch,
                        "heartbeat expired" if a.worker in connected else "connection gone",
                        "requeued" if done.outcome == 1 else "worker_lost",
                        ", charged" if done.charged else "",
                        (f", a suspect (in groups of {done.group} at most)" if done.group else ", a suspect")
                        if done.suspect
                        else "",
                    )
        return taken

    async def _traced(self, job_id: str) -> str:
        """The job's trace context (its spec's), to close a dead attempt's span with."""
        spec = json.loads(await self._store.stored(job_id, keys.JobField.SPEC) or "{}")
        return spec.get("trace_context", "") if isinstance(spec, dict) else ""

    async def _return_inboxes(self, connected: set[str]) -> None:
        for worker in await self._registry.names():
            if worker not in connected and (back := await self._store.return_inbox(worker)):
                log.warning(
                    "%d jobs taken by %s, which died before claiming them, are queued again", back, worker
                )

    async def _route_back(self, connected: set[str]) -> None:
        """Routed jobs past their deadline go back to the shared queues. So does every job
        routed to a worker found dead. That worker's held prefixes go too (api/jobs/routing.py)."""
        for model, names in (await self._registry.by_model()).items():
            if back := await self._router.fall_back(model):
                log.info("%d routed jobs of %s were not taken in time: back in the shared queue", back, model)
            for worker in names:
                # its claims, and RQ's registry of its own queues
                if worker not in connected:
                    routed = [tiers.routed_queue_name(model, p, worker) for p in tiers.ROUTED_TIERS]
                    await self._r.delete(keys.held_prefixes(worker), *map(keys.rq_queue_workers_key, routed))
                    if back := await self._router.fall_back(model, worker):
                        log.warning(
                            "%d jobs routed to %s, which died, are back in the shared queue", back, worker
                        )

    async def _enqueue_pending(self, pending: list[str]) -> None:
        for job_id in pending:
            if await self._store.rescue(job_id):
                log.warning("%s was recorded but never enqueued (its enqueuer died): enqueued now", job_id)
