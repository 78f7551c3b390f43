"""Which of this worker's writes a Redis failover could still take back, and writing them
again when one did (docs/protocol.md, "Failover").

Replication is asynchronous. A promoted replica may lack the primary's last writes. A restart
from an AOF synced every second may lack the last second. So each attempt holds what it wrote
(`Attempt.record`) until it is safe. Once a `period_s`, this thread:

- notes how far each attempt has written. Then it reads the server's replication offset.
  Replicas acknowledge with `REPLCONF ACK`s, about once a second. Once every connected replica
  has acknowledged that offset, those entries are on whichever replica a failover promotes. So
  they are forgotten. A server without replicas has them on disk `fsync_s` after they were
  written (`appendfsync everysec`). That holds unless it had a replica in the last
  `REMEMBER_S`. A worker's first look cannot tell when a replica left. So a primary with none
  but an active backlog is taken to have just lost it. `REMEMBER_S` guards against a primary
  the sentinels have just replaced (its replica promoted). Such a primary takes writes until it
  is demoted. Then it loses them all.
- sees a failover or a restart as a new `run_id` behind the connection. Then it has every
  attempt it still tracks (ended ones too) write again what it holds. The publisher's APPEND
  skips what survived and writes the rest with the ids they had. It does so again at each look
  for `RESEND_FOR_S`. The publisher's own connection may still reach the replaced primary.
  That primary takes writes until the sentinels demote it (about ten seconds after a
  `SENTINEL FAILOVER`). And an ended attempt writes nothing else that would find the loss.

This costs no step anything: no write waits for a replica. A `WAIT` per write would hold every
token for a round trip to the replica. What a client saw may be lost with the primary for a
moment. But the worker that wrote it writes it back with the same ids. So a resume or a replay
gives the same events. On a cluster (`STREAMS_REDIS_URL`), each attempt is checked with the
node that holds its job.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from contract import keys
from contract.servers import is_cluster
from worker.attempts.attempt import Attempt
from worker.redis.periodic import Periodic

log = logging.getLogger(__name__)

# a server that had a replica this recently is not trusted alone
REMEMBER_S = 60.0
# after a server change, what is held is written again at every look this long
RESEND_FOR_S = 15.0


@dataclass
class _Node:
    """One server (a cluster node) as this worker last saw it, and what waits for its replicas."""

    run_id: str | None = None
    # monotonic: when the server behind this connection last had a replica (online or still
    # syncing); kept across its restarts and failovers, whose replica may be promoted
    replica_at: float = -1e9
    # connected at the last look
    replicas: int = 0
    # monotonic: when its run_id last changed
    changed_at: float = -1e9
    # (replication offset, monotonic time, {attempt: entries written by then}), oldest first
    waiting: list[tuple[int, float, dict[Attempt, int]]] = field(default_factory=list)


class Durability:
    def __init__(self, client: redis.Redis, period_s: float = 1.0, fsync_s: float = 2.0) -> None:
        # the streams server's
        self._client = client
        # the job runner's publisher's
        self.resend: Callable[[Attempt], None] = lambda attempt: None
        self._fsync_s = fsync_s
        self._attempts: set[Attempt] = set()
        self._nodes: dict[str, _Node] = {}
        self._lock = threading.Lock()
        self._thread = Periodic("durability", period_s, self.check)

    def start(self) -> None:
        """Look once before the worker takes a job, then once a period on the thread. A claim
        made before the first look would not know to wait for a replica."""
        # Redis away: the thread looks when it is back
        with contextlib.suppress(redis.RedisError):
            self.check()
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def track(self, attempt: Attempt) -> None:
        """Hold `attempt`'s writes until they are safe. It is dropped once it has ended and
        all it wrote is safe."""
        with self._lock:
            self._attempts.add(attempt)

    def replicas_expected(self, job_id: str) -> int:
        """How many replicas of the server holding the job a failover could promote. That is
        those connected at the last look, and at least one if it had one lately. It is 0 if
        none. It is 0 on a cluster too: its keyless `WAIT` has no node to go to. A cluster's
        manual failover waits for the replica to catch up."""
        if is_cluster(self._client):
            return 0
        node = self._nodes.get(self._node_of(job_id)[0])
        if node is None or time.monotonic() - node.replica_at >= REMEMBER_S:
            return 0
        return max(node.replicas, 1)

    @property
    def tracked(self) -> int:
        return len(self._attempts)

    def check(self) -> None:
        """One look: forget what is safe; write again what a failover took back."""
        with self._lock:
            attempts = list(self._attempts)
        by_node: dict[str, tuple[redis.Redis, list[Attempt]]] = {}
        for a in attempts:
            name, client = self._node_of(a.job_id)
            by_node.setdefault(name, (client, []))[1].append(a)
        if not by_node:
            # still watch the server, to know it next time
            by_node[""] = (self._client, [])
        for name, (client, group) in by_node.items():
            self._check_node(name, client, group)
        with self._lock:
            # nothing more will be written, or none of it can be lost
            for a in attempts:
                if a.fenced or a.error is not None or (a.ended and not a.record):
                    self._attempts.discard(a)

    def settle(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for every write to be safe. It is for a worker about to
        exit. After the exit, nobody could write again what a failover takes back."""
        deadline = time.monotonic() + timeout_s
        while self._attempts and time.monotonic() < deadline:
            time.sleep(0.2)

    def _check_node(self, name: str, client: redis.Redis, attempts: list[Attempt]) -> None:
        # before the offset is read: covered by it
        marks = {a: a.written for a in attempts}
        info = client.execute_command("INFO", "server", "replication")
        if info.get("role") != "master":
            # A demoted primary answering still: nothing it says is safe. Behind one name the
            # connections opened before a managed failover stay with it (only writes learn,
            # by READONLY): drop them, so the next look reaches the new primary by the name.
            client.connection_pool.disconnect()
            return
        now = time.monotonic()
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node()
            # it has had a replica: when it left, unknown
            if int(info.get("repl_backlog_active", 0)):
                node.replica_at = now
        run_id = str(info.get("run_id"))
        if node.run_id is not None and run_id != node.run_id:
            log.warning(
                "the streams server changed (a failover or a restart): writing again what %d attempts hold",
                sum(1 for a in attempts if a.record),
            )
            # what the old server's replicas had says nothing now
            node.waiting.clear()
            node.run_id, node.changed_at = run_id, time.monotonic()
            self._resend(attempts)
            # the next look starts counting on this server
            return
        node.run_id = run_id
        if now - node.changed_at < RESEND_FOR_S:
            # in case the last time reached the replaced primary
            self._resend(attempts)
        node.waiting.append((int(info.get("master_repl_offset", 0)), now, marks))
        acked = _replica_offset(info)
        node.replicas = int(info.get("connected_slaves", 0))
        # one still syncing counts
        if acked is not None or int(info.get("connected_slaves", 0)):
            node.replica_at = now
        # no replica lately: none will acknowledge
        alone = now - node.replica_at >= REMEMBER_S
        safe = [
            w
            for w in node.waiting
            if (acked is not None and w[0] <= acked) or (alone and now - w[1] >= self._fsync_s)
        ]
        for w in safe:
            for a, upto in w[2].items():
                a.confirm(upto)
        node.waiting = [w for w in node.waiting if w not in safe]

    def _resend(self, attempts: list[Attempt]) -> None:
        for a in attempts:
            if a.record or not a.ended:
                # returns once written
                self.resend(a)

    def _node_of(self, job_id: str) -> tuple[str, redis.Redis]:
        if not is_cluster(self._client):
            return "", self._client
        node = self._client.get_node_from_key(keys.job(job_id))  # type: ignore[attr-defined]
        return node.name, node.redis_connection


def _replica_offset(info: dict) -> int | None:
    """The offset every connected replica has acknowledged, or None without replicas. A
    failover may promote any of them. The sentinels pass over one that is down or cut off,
    however far it got."""
    offsets = [
        int(v.get("offset", 0))
        for k, v in info.items()
        if k.startswith("slave") and k[5:].isdigit() and isinstance(v, dict) and v.get("state") == "online"
    ]
    return min(offsets) if offsets else None
