"""Chaos campaign: many concurrent streams while workers, API replicas and Redis die at random.

Why: every recovery path (a worker killed or frozen mid-token, an API replica killed under
its clients, Redis restarted from its AOF) has its own integration test, one fault at a time
on a quiet pool. Real incidents overlap and hit busy pools: a worker dies while a batch
neighbour's job is being resumed, a client's resume lands on a replica that is itself
restarting, a POST dies before its first byte. This script keeps N clients streaming for M
minutes on a loopback cluster (Redis with AOF, two API replicas, three workers with the real
model), fires a fault every few seconds, lets each client recover the way a careful client
would, and then checks every stream end to end:

- a client whose connection breaks resumes with `GET /v1/chat/completions/{id}?stream=true`
  and `Last-Event-ID`, alternating between the replicas, with backoff while they or Redis
  are down; a POST that broke before its first event (no job id yet) is sent again
  with the same `Idempotency-Key`, which attaches it to the job the first one may have
  created, and the server answers it from the start;
- each stream's events are stitched across its connections (a resume sends only what follows
  the cursor, so stitching is concatenation of whole events; a torn event is dropped);
- at the end each stitched stream must end with a finish chunk and `data: [DONE]` (no error
  event), pass `devstack/sse_contract.check_stream`, carry strictly increasing event ids, belong
  to a job whose status is `done`, and carry exactly the text, finish reason and usage of the
  server's own replay of the job (a GET with no cursor once it has ended).

Verdicts: hung (no `[DONE]` within `--drain` seconds after the campaign), broken (an error
event, a contract failure, a refused request), lost (text, usage or finish differ from the
replay, or the job vanished). The exit status is 1 if any stream is hung, broken or lost, or
if no stream completed.

    .venv/bin/python bench/faults/chaos.py --streams 8 --minutes 5 [--seed 1] [--fault-every 4] \\
        [--faults kill,stop,api,redis|failover] [--defaults] [--cycle] [--drain 120] [--json out.json]
    .venv/bin/python bench/faults/chaos.py --storm [--seed 2]

`--faults` may name a kind more than once to weigh it: `kill,kill,stop,api,redis` kills twice
as often as it fires each other kind. `--storm` is the crash storm of issue 58, a campaign no
one here wrote: 30 streams for 8 minutes at the defaults (a worker sizes itself to 32 slots),
a fault every ~9 s from that kill-heavy mix, each kill aimed at a worker holding jobs, and
150 s for the streams left at the end. Every stream must end whole; "stalls" says how long
a stream waited for its next token at worst (`max`).

With `failover` among the faults, Redis is a primary, a replica and three sentinels (a
`redis+sentinel://` URL), and the fault fails the primary over, one of three ways at random:
SIGKILL it; SIGKILL it while the replica is frozen (SIGSTOP), so that the promoted replica
lacks the primary's last writes (docs/protocol.md, "Failover"); or `SENTINEL FAILOVER`,
which leaves the old primary taking writes until the sentinels demote it. A killed primary
comes back on its port, as a replica; the `redis` fault then restarts the primary (with its
AOF), which the sentinels may or may not fail over meanwhile. `--defaults` runs the workers
and the API at their default settings (a worker sizes itself: 32 slots here), as a user
would, rather than the recorded runs' `SLOTS=4` and shortened recovery timings.

`tests/integration/test_chaos.py` runs a one-minute campaign of the same code in the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # devstack.sse_contract, when run as a script

from contract import keys  # noqa: E402
from contract.servers import sync_client  # noqa: E402
from devstack.peek import job_ids, running_ids  # noqa: E402
from devstack.processes import (  # noqa: E402
    Proc,
    Watched,
    free_port,
    start_api,
    start_redis,
    start_watched,
    start_worker,
    wait_for_model,
)
from devstack.sse_contract import Parsed, check_stream  # noqa: E402
from worker.settings import DEFAULT_MODEL_NAME  # noqa: E402

MODEL = DEFAULT_MODEL_NAME
CHAT = "/v1/chat/completions"
FAULT_KINDS = ("kill", "stop", "api", "redis", "failover")
STORM = "kill,kill,stop,api,redis"  # --storm's mix: a kill twice as often as each other fault
HEARTBEAT_WINDOW_S = 3.0  # the workers' HEARTBEAT_WINDOW_SECONDS (left at its default)
RETRYABLE = frozenset({429, 502, 503, 504})  # statuses a careful client retries
STALL_S = 1.0  # a silence at least this long between two events counts as a stall
OPENING_ID = "0-0"  # the chat role chunk's event id
SAFE_OUTCOME = (AssertionError, ValueError, KeyError, IndexError, TypeError)  # a failed check


@dataclass(frozen=True)
class Config:
    streams: int = 6
    minutes: float = 1.0
    seed: int = 1
    fault_every: float = 4.0  # mean seconds between faults
    faults: tuple[str, ...] = ("kill", "stop", "api", "redis")
    cycle: bool = False  # fire the kinds in turn instead of at random
    drain_s: float = 120.0  # after the campaign, how long unfinished streams may take
    workers: int = 3
    replicas: int = 2
    slots: int = 4
    threads: int = max(1, (os.cpu_count() or 1) // 3)  # per worker
    read_timeout_s: float = 10.0  # keep-alives come every second: longer means a dead connection
    logs: Path | None = None  # where the processes' logs go (default: a new temporary directory)
    verbose: bool = True  # print each fault as it fires
    defaults: bool = False  # the workers' and the API's own settings, not the recorded runs'

    @property
    def sentinel(self) -> bool:
        """Redis as a primary, a replica and three sentinels (the `failover` fault)."""
        return "failover" in self.faults

    def api_env(self) -> dict[str, str]:
        if self.defaults:  # what a client needs of the server, nothing about recovery
            return {"KEEPALIVE_SECONDS": "1", "MAX_STREAMS_PER_KEY": "0", "MAX_JOBS_PER_KEY": "0"}
        return {
            "KEEPALIVE_SECONDS": "1",
            "CANCEL_GRACE_SECONDS": "30",
            # above the workers' reconnect backoff (worker/redis/outage.py, 2 s at most): with 1 s,
            # a live worker still reconnecting after a Redis restart was judged dead and its
            # job charged (a stream of the 10-minute run ended worker_lost that way)
            "REAPER_SETTLE_SECONDS": "3",
            "MAX_STREAMS_PER_KEY": "0",  # the campaign tests recovery, not per-key limits
            "MAX_JOBS_PER_KEY": "0",
        }

    def worker_env(self) -> dict[str, str]:
        if self.defaults:
            return {}
        n = str(self.threads)
        return {"SLOTS": str(self.slots), "N_THREADS": n, "N_THREADS_BATCH": n}


# ---------------------------------------------------------------- the processes


class Cluster:
    """Redis (AOF, restarted on its port and data directory), API replicas on fixed ports,
    and a pool of workers kept at `cfg.workers`; notes every process that died on its own."""

    def __init__(self, cfg: Config, logs: Path) -> None:
        self.cfg = cfg
        self.logs = logs
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.redis_proc: Proc | None = None
        self.watched: Watched | None = None  # with the failover fault
        self.nodes: dict[int, Proc] = {}  # the watched primary's and replica's, by port
        self.ports = [free_port() for _ in range(cfg.replicas)]
        self.apis: list[Proc | None] = [None] * cfg.replicas
        self.workers: dict[str, Proc] = {}
        self.spawned = 0
        self.unexpected: list[str] = []  # processes that exited without being told to
        self.stopped: set[str] = set()  # workers frozen (SIGSTOP) now
        self.r = redis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2)

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def boot(self) -> None:
        if self.cfg.sentinel:
            # A primary silent for 3 s is failed over: a restart (about a second) is not.
            self.watched = start_watched(self.logs, down_after_ms=3000, appendonly=True)
            self.redis_url = self.watched.url
            self.nodes = {port: getattr(self.watched, role) for role, port in self.watched.ports.items()}
            self.r = sync_client(self.redis_url, socket_timeout=2, socket_connect_timeout=2)
        else:
            self.redis_proc, _ = start_redis(self.logs, port=self.redis_port, appendonly=True)
        for i in range(len(self.ports)):
            self.start_api(i)
        for _ in range(self.cfg.workers):
            self.spawn_worker()
        procs = tuple(p for p in (*self.apis, *self.workers.values()) if p is not None)
        wait_for_model(self.bases[0], MODEL, timeout=300, procs=procs)
        self.wait_workers_connected(300)

    def start_api(self, i: int) -> None:
        self.apis[i], _ = start_api(
            self.logs, self.redis_url, port=self.ports[i], name=f"api{i}", env=self.cfg.api_env()
        )

    def spawn_worker(self) -> Proc:
        self.spawned += 1
        name = f"w{self.spawned}"
        self.workers[name] = start_worker(self.logs, self.redis_url, name=name, env=self.cfg.worker_env())
        return self.workers[name]

    def wait_workers_connected(self, timeout: float) -> None:
        """Until every worker has its model loaded and its named connection open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:  # connected from its start, serving once it announced itself
                named = {c["name"] for c in self.r.client_list()}
                serving = {n.decode() for n in self.r.zrange(keys.workers(MODEL), 0, -1)}
            except redis.RedisError:
                named, serving = set(), set()
            if all(keys.WORKER_CONNECTION_PREFIX + n in named and n in serving for n in self.workers):
                return
            time.sleep(0.2)
        raise TimeoutError(f"workers not connected after {timeout}s: {sorted(self.workers)}")

    def busy_workers(self) -> list[Proc]:
        """The live workers holding a running job (the job hash's `worker` field)."""
        try:
            running = running_ids(self.r)
            names = {self.r.hget(keys.job(job_id), keys.JobField.WORKER) for job_id in running}
        except redis.RedisError:
            return []
        procs = (self.workers.get(n.decode()) for n in names if n)
        return sorted((p for p in procs if p is not None and p.alive()), key=lambda p: p.name)

    def kill_worker(self, victim: Proc) -> None:
        victim.signal(signal.SIGKILL)
        victim.popen.wait(timeout=30)
        self.workers.pop(victim.name, None)

    def restart_api(self, i: int, down_s: float) -> None:
        proc = self.apis[i]
        if proc is not None:
            proc.signal(signal.SIGKILL)
            proc.popen.wait(timeout=30)
        time.sleep(down_s)
        self.start_api(i)

    def restart_redis(self, sig: int, down_s: float) -> None:
        """Stop Redis with `sig`, then start it on the same port and data directory: it
        replays its AOF (fsync always: a restart loses nothing). Through Sentinel, the
        primary: back within a second it may still be the primary, or the sentinels may have
        failed it over meanwhile (it then comes back with stale data until they demote it)."""
        if self.watched is not None:
            port = self.primary_port()
            self.nodes[port].signal(sig)
            self.nodes[port].popen.wait(timeout=30)
            time.sleep(down_s)
            self.nodes[port], _ = start_redis(self.logs, port=port, appendonly=True)
            (other,) = (p for p in self.nodes if p != port)
            self.wait_replica_synced(other)  # the next fault finds a replica in sync
            return
        if self.redis_proc is not None:
            self.redis_proc.signal(sig)
            self.redis_proc.popen.wait(timeout=30)
        time.sleep(down_s)
        self.redis_proc, _ = start_redis(self.logs, port=self.redis_port, appendonly=True)

    def supervise(self) -> None:
        """Replace what died without being told to (as a process supervisor would) and note it."""
        for name, p in list(self.workers.items()):
            if not p.alive():
                self._note_exit(p)
                del self.workers[name]
        while len(self.workers) < self.cfg.workers:
            self.spawn_worker()
        for i, p in enumerate(self.apis):
            if p is None or not p.alive():
                if p is not None:
                    self._note_exit(p)
                self.restart_api(i, 0)
        if self.watched is not None:
            for port, p in list(self.nodes.items()):
                if not p.alive():  # the failover fault brings back what it kills: this one died
                    self._note_exit(p)
                    self.nodes[port], _ = start_redis(self.logs, port=port, appendonly=True)
            for p in self.watched.sentinels:
                if not p.alive():
                    self._note_exit(p)
        elif self.redis_proc is None or not self.redis_proc.alive():
            if self.redis_proc is not None:
                self._note_exit(self.redis_proc)
            self.restart_redis(signal.SIGKILL, 0)

    def _note_exit(self, p: Proc) -> None:
        tail = " | ".join(p.log().strip().splitlines()[-3:])[-600:]
        self.unexpected.append(f"{p.name} exited ({p.popen.returncode}), {p.log_path}: {tail}")

    def shutdown(self) -> None:
        for p in self.workers.values():
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGKILL)
        for p in self.apis:
            if p is not None:
                p.stop()
        if self.redis_proc is not None:
            self.redis_proc.stop()
        if self.watched is not None:
            for p in (*self.watched.sentinels, *self.nodes.values()):
                p.signal(signal.SIGCONT)
                p.stop()

    def primary_port(self) -> int:
        """Where the sentinels say the primary is."""
        assert self.watched is not None
        port = int(self.watched.url.split("//", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
        with redis.Redis(port=port, socket_timeout=5) as sentinel:
            return int(sentinel.sentinel_get_master_addr_by_name("tokenspool")[1])

    def sentinel_command(self, *args: str) -> None:
        assert self.watched is not None
        port = int(self.watched.url.split("//", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
        with redis.Redis(port=port, socket_timeout=5) as sentinel:
            sentinel.execute_command(*args)

    def wait_for_primary(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.primary_port() != port:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sentinels did not promote {port}")
            time.sleep(0.1)

    def wait_replica_synced(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with redis.Redis(port=port, socket_timeout=5) as r:
            while r.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{port} did not become a replica in sync")
                time.sleep(0.2)


# ---------------------------------------------------------------- the faults


def pick_busy(cluster: Cluster, rng: random.Random, wait_s: float = 3.0) -> Proc | None:
    """A worker holding a running job, waiting a little for one if the pool is idle."""
    deadline = time.monotonic() + wait_s
    while True:
        busy = cluster.busy_workers()
        if busy or time.monotonic() >= deadline:
            return rng.choice(busy) if busy else None
        time.sleep(0.1)


def fault_kill(cluster: Cluster, rng: random.Random) -> str:
    victim = pick_busy(cluster, rng)
    if victim is None:
        return "skipped: no worker holds a running job"
    cluster.kill_worker(victim)
    return f"SIGKILL {victim.name}, started {cluster.spawn_worker().name}"


def fault_stop(cluster: Cluster, rng: random.Random) -> str:
    victim = pick_busy(cluster, rng)
    if victim is None:
        return "skipped: no worker holds a running job"
    frozen = HEARTBEAT_WINDOW_S + rng.uniform(1.0, 3.0)
    cluster.stopped.add(victim.name)
    victim.signal(signal.SIGSTOP)
    time.sleep(frozen)
    try:
        if rng.random() < 0.25:
            cluster.kill_worker(victim)
            return f"SIGSTOP {victim.name} for {frozen:.1f}s, SIGKILL, started {cluster.spawn_worker().name}"
        victim.signal(signal.SIGCONT)
        return f"SIGSTOP {victim.name} for {frozen:.1f}s, SIGCONT"
    finally:
        cluster.stopped.discard(victim.name)


def fault_api(cluster: Cluster, rng: random.Random) -> str:
    i = rng.randrange(len(cluster.apis))
    down = rng.uniform(0.2, 1.5)
    cluster.restart_api(i, down)
    return f"SIGKILL api{i}, restarted after {down:.1f}s"


def fault_redis(cluster: Cluster, rng: random.Random) -> str:
    sig = rng.choice((signal.SIGTERM, signal.SIGKILL))
    down = rng.uniform(0.7, 1.3)
    cluster.restart_redis(sig, down)
    return f"{sig.name} redis, restarted after {down:.1f}s"


def fault_failover(cluster: Cluster, rng: random.Random) -> str:
    """Fail the primary over: killed, killed with its replica held behind, or asked of the
    sentinels; a killed primary comes back on its port (the sentinels make it a replica)."""
    old = cluster.primary_port()
    (new,) = (port for port in cluster.nodes if port != old)
    cluster.wait_replica_synced(new)  # after a restart, the replica may still be catching up
    how = rng.choice(("kill", "behind", "planned"))
    if how == "planned":
        cluster.sentinel_command("SENTINEL", "FAILOVER", "tokenspool")
        cluster.wait_for_primary(new)
        detail = f"SENTINEL FAILOVER {old} -> {new}"
    else:
        held = 0.0
        if how == "behind":  # the replica misses what the primary takes meanwhile
            held = rng.uniform(0.5, 2.0)
            cluster.nodes[new].signal(signal.SIGSTOP)
            time.sleep(held)
        cluster.nodes[old].signal(signal.SIGKILL)
        cluster.nodes[old].popen.wait(timeout=30)
        cluster.nodes[new].signal(signal.SIGCONT)
        cluster.wait_for_primary(new)
        cluster.nodes[old], _ = start_redis(cluster.logs, port=old, appendonly=True)
        detail = f"SIGKILL primary {old}" + (f" with its replica held {held:.1f}s behind" if held else "")
        detail += f", {new} promoted, {old} back"
    cluster.wait_replica_synced(old)  # the next failover has a replica to promote
    return detail


FAULTS: dict[str, Callable[[Cluster, random.Random], str]] = {
    "kill": fault_kill,
    "stop": fault_stop,
    "api": fault_api,
    "redis": fault_redis,
    "failover": fault_failover,
}


@dataclass
class FaultRecord:
    at_s: float  # since the campaign started
    kind: str
    detail: str

    @property
    def fired(self) -> bool:
        return not self.detail.startswith(("skipped", "failed"))


class FreeSlots:
    """Whether a live worker (its model loaded and its connection named, not frozen) had a
    free slot, sampled twice a second: issue 58's aim is a next token within 30 s whenever
    one had, so each stall is also measured counting only that time."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, bool]] = []

    def watch(self, going: Callable[[], bool]) -> None:
        while going():
            self.samples.append((time.monotonic(), self._free()))
            time.sleep(0.5)

    def _free(self) -> bool:
        cluster, r = self.cluster, self.cluster.r
        try:
            prefix = keys.WORKER_CONNECTION_PREFIX
            named = {c["name"][len(prefix) :] for c in r.client_list() if c["name"].startswith(prefix)}
            slots = {k.decode(): int(v) for k, v in r.hgetall(keys.worker_slots(MODEL)).items()}
            running = running_ids(r)
            with r.pipeline(transaction=False) as pipe:
                for job_id in running:
                    pipe.hget(keys.job(job_id), keys.JobField.WORKER)
                holders = [w.decode() for w in pipe.execute() if w]
        except redis.RedisError:
            return False  # Redis down: no worker can take anything
        live = [n for n in named if n in cluster.workers and n not in cluster.stopped]
        return any(holders.count(n) < slots.get(n, 0) for n in live)

    def within(self, start: float, end: float) -> float:
        """Seconds of [start, end] sampled as free (each sample holds until the next)."""
        total = 0.0
        for (t, free), (t_next, _) in itertools.pairwise(self.samples):
            if free:
                total += max(0.0, min(t_next, end) - max(t, start))
        return total


# ---------------------------------------------------------------- one client stream


@dataclass
class Stitched:
    """One stream's events across its connections: whole events only, in arrival order."""

    raw: bytearray = field(default_factory=bytearray)
    pending: bytearray = field(default_factory=bytearray)  # an event not yet complete
    job_id: str | None = None
    last_id: str | None = None
    done: bool = False
    broke_at: float | None = None  # when the current interruption began
    last_event_at: float | None = None
    recovery_gaps: list[float] = field(default_factory=list)  # a break -> the next event
    stalls: list[tuple[float, float]] = field(default_factory=list)  # silences >= STALL_S: (from, to)

    def feed(self, data: bytes, now: float) -> None:
        self.pending += data
        while (end := self.pending.find(b"\n\n")) >= 0:
            block = bytes(self.pending[:end])
            del self.pending[: end + 2]
            self._accept(block, now)

    def _accept(self, block: bytes, now: float) -> None:
        self.raw += block + b"\n\n"
        fields = dict(line.split(": ", 1) for line in block.decode("utf-8").split("\n") if ": " in line)
        data, event_id = fields.get("data", ""), fields.get("id")
        if data == "[DONE]":
            self.done = True
        if event_id is None:  # a keep-alive, [DONE], or an error from the relay itself
            return
        if self.broke_at is not None:
            self.recovery_gaps.append(now - self.broke_at)
            self.broke_at = None
        after_opening = self.last_id == OPENING_ID  # the wait for the first token is no stall
        if self.last_event_at is not None and not after_opening and now - self.last_event_at >= STALL_S:
            self.stalls.append((self.last_event_at, now))
        self.last_event_at = now
        self.last_id = event_id
        if self.job_id is None:
            self.job_id = json.loads(data)["id"]

    def cut(self, now: float) -> None:
        """The connection broke: drop the torn event; before any event (no job id),
        drop everything, since the retried POST answers from the start."""
        self.pending.clear()
        if self.job_id is None:
            self.raw.clear()
        if self.broke_at is None:
            self.broke_at = now


@dataclass
class StreamRecord:
    n: int
    key: str  # the Idempotency-Key of its POST
    body: dict
    sse: Stitched = field(default_factory=Stitched)
    posts: int = 0
    resumes: int = 0
    verdict: str = ""  # "ok", "hung", "broken" or "lost"
    reason: str = ""

    def fail(self, verdict: str, reason: str) -> None:
        if not self.verdict:
            self.verdict, self.reason = verdict, reason


TOPICS = (
    "a lighthouse keeper and a storm",
    "a dragon who collects teapots",
    "a clockmaker's last clock",
    "the first rain on Mars",
    "a sailor lost in fog",
    "a library that opens at midnight",
    "a fox learning to read",
    "an old bridge and a river",
)
FORMS = (
    "Write a long story about {}.",
    "Describe {} in vivid detail.",
    "Write a poem about {}.",
    "Explain to a child what happens in a tale of {}.",
    "List many facts one might invent about {}.",
)


def request_body(n: int, seed: int) -> dict:
    rng = random.Random(f"{seed}:{n}")
    body: dict = {
        "model": MODEL,
        "messages": [{"role": "user", "content": rng.choice(FORMS).format(rng.choice(TOPICS))}],
        "max_tokens": rng.randint(64, 160),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body |= {"temperature": 0.8, "seed": rng.randrange(2**31)}
    return body


class Client:
    """Runs one stream to its `[DONE]`: POST, then resumes on the replicas in turn."""

    def __init__(self, rec: StreamRecord, bases: list[str], give_up_at: float, cfg: Config) -> None:
        self.rec = rec
        self.bases = bases
        self.give_up_at = give_up_at
        self.timeout = httpx.Timeout(cfg.read_timeout_s, connect=2.0)
        self.rng = random.Random(rec.key)

    def run(self) -> None:
        rec, replica, failures = self.rec, self.rec.n % len(self.bases), 0
        while not rec.sse.done and not rec.verdict:
            if time.monotonic() >= self.give_up_at:
                rec.fail("hung", f"no [DONE] by the deadline (last event id {rec.sse.last_id})")
                return
            before = rec.sse.last_id
            with contextlib.suppress(httpx.TransportError):  # a replica down, a reset, a timeout
                self._connect(self.bases[replica])
            if rec.sse.done or rec.verdict:
                return
            rec.sse.cut(time.monotonic())
            failures = 0 if rec.sse.last_id != before else failures + 1
            replica = (replica + 1) % len(self.bases)
            time.sleep(min(2.0, 0.1 * 2**failures) * self.rng.uniform(0.5, 1.0))

    def _connect(self, base: str) -> None:
        rec = self.rec
        if rec.sse.job_id is None:
            rec.posts += 1
            request = httpx.stream(
                "POST", base + CHAT, json=rec.body, headers={"Idempotency-Key": rec.key}, timeout=self.timeout
            )
        else:
            url = f"{base}{CHAT}/{rec.sse.job_id}?stream=true"
            headers = {"Last-Event-ID": rec.sse.last_id or ""}
            request = httpx.stream("GET", url, headers=headers, timeout=self.timeout)
        with request as resp:
            if resp.status_code != 200:
                self._refused(resp)
                return
            rec.resumes += rec.sse.job_id is not None
            for chunk in resp.iter_bytes():
                rec.sse.feed(chunk, time.monotonic())
                if rec.sse.done or time.monotonic() >= self.give_up_at:
                    return

    def _refused(self, resp: httpx.Response) -> None:
        body = resp.read()[:300].decode(errors="replace")
        if resp.status_code in RETRYABLE:
            return
        what = f"{resp.request.method} {resp.request.url.path} answered {resp.status_code}: {body}"
        self.rec.fail("lost" if resp.status_code == 404 and self.rec.sse.job_id else "broken", what)


# ---------------------------------------------------------------- checking the streams


def event_ids(raw: bytes) -> list[str]:
    return [line[4:] for line in raw.decode("utf-8").split("\n") if line.startswith("id: ")]


def _id_key(event_id: str) -> tuple[int, int, bool]:
    entry, _, usage = event_id.partition("/")
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq), bool(usage)


def ids_increasing(raw: bytes) -> bool:
    order = [_id_key(i) for i in event_ids(raw)]
    return all(a < b for a, b in itertools.pairwise(order))


def replay(bases: list[str], job_id: str, attempts: int = 10) -> bytes:
    """The server's own stream of the job, from the start (no cursor)."""
    for attempt in range(attempts):
        base = bases[attempt % len(bases)]
        try:
            resp = httpx.get(f"{base}{CHAT}/{job_id}?stream=true", timeout=60)
            if resp.status_code == 200:
                return resp.content
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no replay of {job_id} after {attempts} attempts")


def text_difference(got: str, want: str) -> str:
    pairs = enumerate(zip(got, want, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
    return (
        f"text differs from the replay at char {at} (client {len(got)} chars, replay {len(want)}): "
        f"client {got[max(0, at - 20) : at + 40]!r} vs replay {want[max(0, at - 20) : at + 40]!r}"
    )


def verify(rec: StreamRecord, bases: list[str], r: redis.Redis) -> None:
    """Sets the record's verdict (see the module docstring)."""
    if rec.verdict:
        return
    raw = bytes(rec.sse.raw)
    try:
        got = check_stream(raw, "chat", include_usage=True)
    except SAFE_OUTCOME as exc:
        rec.fail("broken", f"contract: {exc!r}")
        return
    problem = _stream_problem(rec, got, raw, r)
    if problem:
        rec.fail("broken", problem)
        return
    job_id = rec.sse.job_id or ""
    try:
        want = check_stream(replay(bases, job_id), "chat", include_usage=True)
    except (*SAFE_OUTCOME, RuntimeError) as exc:
        rec.fail("lost", f"replay of {job_id}: {exc!r}")
        return
    if got.text != want.text:
        rec.fail("lost", text_difference(got.text, want.text))
    elif (got.finish_reason, got.usage) != (want.finish_reason, want.usage):
        mine, theirs = (got.finish_reason, got.usage), (want.finish_reason, want.usage)
        rec.fail("lost", f"finish and usage {mine} differ from the replay's {theirs}")
    else:
        rec.verdict = "ok"


def _stream_problem(rec: StreamRecord, got: Parsed, raw: bytes, r: redis.Redis) -> str:
    if got.error is not None:
        return f"error event: {got.error}"
    if not ids_increasing(raw):
        return f"event ids not strictly increasing: {event_ids(raw)}"
    if got.usage is None or got.usage["completion_tokens"] > rec.body["max_tokens"]:
        return f"usage {got.usage} for max_tokens {rec.body['max_tokens']}"
    try:
        status = r.hget(keys.job(rec.sse.job_id or ""), keys.JobField.STATUS)
    except redis.RedisError as exc:
        return f"could not read the job's status: {exc!r}"
    if status != b"done":
        return f"job status {status!r}, not done (cancelled: a resume came after the grace?)"
    return ""


def job_facts(r: redis.Redis, job_id: str) -> str:
    """Where a job that failed its check stands in Redis: its hash, and which lists hold it
    (the model's queue; RQ's intermediate list or a worker's inbox: taken, never claimed)."""
    mine = job_id.encode()  # a continuation's RQ id starts with the job id
    try:
        state = r.hgetall(keys.job(job_id))
        lists = [
            key.decode()
            for key in r.scan_iter(count=1000, _type="list")
            if any(item.startswith(mine) for item in r.lrange(key, 0, -1))
        ]
        running = r.zscore(keys.running(keys.shard(job_id)), job_id) is not None
    except redis.RedisError as exc:
        return f"job state unreadable: {exc!r}"
    if not state:
        return "no job hash"
    fields = (keys.JobField.STATUS, keys.JobField.ATTEMPTS, keys.JobField.EPOCH, keys.JobField.WORKER)
    facts = [f"{f}={state.get(f.encode(), b'-').decode()}" for f in fields]
    facts += [f"in {key}" for key in lists]
    facts += ["in its shard's running index"] if running else []
    return ", ".join(facts)


def orphan_jobs(r: redis.Redis, seen: set[str]) -> int:
    """Jobs in Redis that no client's stream ever named: a POST that died before its first
    event and whose retry was not attached to it (no Idempotency-Key support)."""
    try:
        ids = job_ids(r)
    except redis.RedisError:
        return -1
    return len(ids - seen)


# ---------------------------------------------------------------- the campaign


@dataclass
class Spread:
    n: int
    p50: float | None
    p95: float | None
    most: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(len(values), quantile(values, 0.5), quantile(values, 0.95), max(values, default=None))

    def __str__(self) -> str:
        if not self.n:
            return "n=0"
        return f"n={self.n}  p50 {self.p50:.2f} s  p95 {self.p95:.2f} s  max {self.most:.2f} s"


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class Report:
    config: dict
    logs: str
    seconds: float
    started: int
    completed: int
    hung: int
    broken: int
    lost: int
    resumes: int
    post_retries: int
    orphan_jobs: int  # informative: jobs created by POSTs whose retry did not attach to them
    faults: dict[str, int]
    faults_skipped: int
    recovery_gaps: Spread
    stalls: Spread
    stalls_free: Spread  # the same stalls, counting only the time a live worker had a free slot
    longest_stalls: list[dict]  # the five longest: which job, when (s into the campaign), how long
    fault_log: list[FaultRecord]
    unexpected_exits: list[str]
    failures: list[dict]

    @property
    def ok(self) -> bool:
        return self.completed > 0 and not (self.hung or self.broken or self.lost)


class Campaign:
    def __init__(self, cfg: Config, cluster: Cluster) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.rng = random.Random(cfg.seed)
        self.t0 = time.monotonic()
        self.end = self.t0 + cfg.minutes * 60
        self.give_up_at = self.end + cfg.drain_s
        self.slots: list[list[StreamRecord]] = [[] for _ in range(cfg.streams)]
        self.fault_log: list[FaultRecord] = []
        self.free = FreeSlots(cluster)

    def run(self) -> Report:
        slots = range(self.cfg.streams)
        threads = [threading.Thread(target=self._slot, args=(i,), daemon=True) for i in slots]
        for t in threads:
            t.start()
        watch = threading.Thread(target=self.free.watch, args=(lambda: any(t.is_alive() for t in threads),))
        watch.start()
        self._inject_faults()
        self._supervise()  # the drain runs on a whole cluster
        for t in threads:
            t.join(max(0.0, self.give_up_at - time.monotonic()) + self.cfg.read_timeout_s + 30)
        watch.join()
        records = [rec for slot in self.slots for rec in slot]
        for rec in records:
            if not rec.sse.done and not rec.verdict:
                rec.fail("hung", f"its client is still waiting (last event id {rec.sse.last_id})")
            verify(rec, self.cluster.bases, self.cluster.r)
            if rec.verdict != "ok" and rec.sse.job_id:
                rec.reason += f" [job: {job_facts(self.cluster.r, rec.sse.job_id)}]"
        return self._report(records)

    def _slot(self, i: int) -> None:
        """One of the N concurrent streams: a new one as soon as the last ends, until the end."""
        while time.monotonic() < self.end:
            n = i + len(self.slots[i]) * self.cfg.streams
            rec = StreamRecord(n, str(uuid.uuid4()), request_body(n, self.cfg.seed))
            self.slots[i].append(rec)
            try:
                Client(rec, self.cluster.bases, self.give_up_at, self.cfg).run()
            except Exception as exc:  # a harness bug must show as a verdict, not a silent thread
                rec.fail("broken", f"client crashed: {exc!r}")

    def _kinds(self) -> Iterator[str]:
        if self.cfg.cycle:
            yield from itertools.cycle(self.cfg.faults)
        while True:
            yield self.rng.choice(self.cfg.faults)

    def _inject_faults(self) -> None:
        kinds = self._kinds()
        next_at = self.t0 + self.cfg.fault_every  # let the first streams get going
        while True:
            time.sleep(max(0.0, min(next_at, self.end) - time.monotonic()))
            if time.monotonic() >= self.end:
                return
            self._fire(next(kinds))
            next_at = time.monotonic() + self.cfg.fault_every * self.rng.uniform(0.5, 1.5)

    def _supervise(self) -> None:
        try:
            self.cluster.supervise()
        except Exception as exc:  # e.g. a replica that did not come back: noted, retried later
            self.cluster.unexpected.append(f"supervising failed: {exc!r}"[:600])

    def _fire(self, kind: str) -> None:
        at = time.monotonic() - self.t0
        self._supervise()
        try:
            detail = FAULTS[kind](self.cluster, self.rng)
        except Exception as exc:  # a restart that did not come up: the next supervise retries
            detail = f"failed: {exc!r}"[:500]
        self.fault_log.append(FaultRecord(round(at, 2), kind, detail))
        if self.cfg.verbose:
            print(f"[{at:6.1f}s] {kind:<5} {detail}", file=sys.stderr, flush=True)

    def _report(self, records: list[StreamRecord]) -> Report:
        fired = [f for f in self.fault_log if f.fired]
        count = {v: sum(r.verdict == v for r in records) for v in ("ok", "hung", "broken", "lost")}
        return Report(
            config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(self.cfg).items()},
            logs=str(self.cluster.logs),
            seconds=round(time.monotonic() - self.t0, 1),
            started=len(records),
            completed=sum(r.sse.done for r in records),
            hung=count["hung"],
            broken=count["broken"],
            lost=count["lost"],
            resumes=sum(r.resumes for r in records),
            post_retries=sum(max(0, r.posts - 1) for r in records),
            orphan_jobs=orphan_jobs(self.cluster.r, {r.sse.job_id or "" for r in records}),
            faults={k: sum(f.kind == k for f in fired) for k in dict.fromkeys(self.cfg.faults)},
            faults_skipped=len(self.fault_log) - len(fired),
            recovery_gaps=Spread.of([g for r in records for g in r.sse.recovery_gaps]),
            stalls=Spread.of([b - a for r in records for a, b in r.sse.stalls]),
            stalls_free=Spread.of([self.free.within(a, b) for r in records for a, b in r.sse.stalls]),
            longest_stalls=[
                {"id": job_id, "at_s": round(a - self.t0, 1), "seconds": round(b - a, 1)}
                for job_id, a, b in sorted(
                    ((r.sse.job_id, a, b) for r in records for a, b in r.sse.stalls),
                    key=lambda s: s[1] - s[2],
                )[:5]
            ],
            fault_log=self.fault_log,
            unexpected_exits=self.cluster.unexpected,
            failures=[
                {"stream": r.n, "id": r.sse.job_id, "verdict": r.verdict, "reason": r.reason}
                for r in records
                if r.verdict != "ok"
            ],
        )


def run_campaign(cfg: Config) -> Report:
    logs = cfg.logs or Path(tempfile.mkdtemp(prefix="chaos-"))
    cluster = Cluster(cfg, logs)
    try:
        cluster.boot()
        return Campaign(cfg, cluster).run()
    finally:
        cluster.shutdown()


def format_summary(report: Report) -> str:
    c = report.config
    faults = "  ".join(f"{k} {v}" for k, v in report.faults.items())
    lines = [
        f"chaos: {c['streams']} streams x {c['minutes']} min, seed {c['seed']},"
        f" a fault every ~{c['fault_every']} s ({','.join(c['faults'])}), {report.seconds} s in all;"
        f" logs in {report.logs}",
        "started  completed  hung  broken  lost  resumes  post-retries",
        f"{report.started:>7}  {report.completed:>9}  {report.hung:>4}  {report.broken:>6}  {report.lost:>4}"
        f"  {report.resumes:>7}  {report.post_retries:>12}",
        f"faults: {faults}  (skipped or failed: {report.faults_skipped})",
        f"jobs no stream saw (POST retries not attached to their first job): {report.orphan_jobs}",
        f"recovery gaps (a broken connection -> the next event): {report.recovery_gaps}",
        f"stalls (>= {STALL_S:.0f} s between two events of a stream):     {report.stalls}",
        f"  the time of each while a live worker had a free slot:  {report.stalls_free}",
        "  the longest: "
        + ", ".join(f"{s['seconds']} s at {s['at_s']} s ({s['id']})" for s in report.longest_stalls),
        f"processes that exited on their own: {len(report.unexpected_exits)}",
        *(f"  {line}" for line in report.unexpected_exits),
        *(f"  {f['verdict']:<6} stream {f['stream']} {f['id']}: {f['reason']}" for f in report.failures),
    ]
    return "\n".join(lines)


def format_fault_log(report: Report) -> str:
    return "\n".join(f"[{f.at_s:6.1f}s] {f.kind:<5} {f.detail}" for f in report.fault_log)


def parse_args(argv: list[str] | None) -> tuple[Config, Path | None]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=8, help="concurrent client streams")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between faults")
    ap.add_argument(
        "--faults", default="kill,stop,api,redis", help="comma-separated: kill,stop,api,redis,failover"
    )
    ap.add_argument("--defaults", action="store_true", help="workers and API at their default settings")
    ap.add_argument("--cycle", action="store_true", help="fire the kinds in turn, not at random")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds unfinished streams get at the end")
    ap.add_argument("--logs", type=Path, help="directory for the processes' logs")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument(
        "--storm", action="store_true", help="issue 58's crash storm (see above); overrides the rest"
    )
    args = ap.parse_args(argv)
    if args.storm:
        args.streams, args.minutes, args.fault_every, args.defaults, args.drain = 30, 8.0, 9.0, True, 150.0
        args.faults = STORM
    faults = tuple(k for k in args.faults.split(",") if k)
    if not faults or set(faults) - set(FAULT_KINDS):
        ap.error(f"--faults takes some of {','.join(FAULT_KINDS)}")
    cfg = Config(
        streams=args.streams,
        minutes=args.minutes,
        seed=args.seed,
        fault_every=args.fault_every,
        faults=faults,
        cycle=args.cycle,
        drain_s=args.drain,
        logs=args.logs,
        defaults=args.defaults,
    )
    return cfg, args.json


def main(argv: list[str] | None = None) -> int:
    cfg, json_out = parse_args(argv)
    report = run_campaign(cfg)
    print(format_summary(report))
    if json_out is not None:
        json_out.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
