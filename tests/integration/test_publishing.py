"""The publisher against real servers (valkey, Redis 7.0): what one round trip does to the
API's reader, blocked in one XREAD over every open stream, that a round trip whose scripts
Redis lost (a restart, SCRIPT FLUSH) is loaded and sent again, each entry once, and that its
writes follow a streams cluster's failover."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import redis

from contract import entries, keys
from contract.entries import Delta
from contract.keys import JobField
from contract.servers import sync_client
from contract.settings import Recovery
from devstack.cluster import start_cluster
from devstack.processes import start_redis
from tests.integration.conftest import _server_kinds
from worker.attempts.attempt import Claims
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

RECOVERY = Recovery(retention_s=60)
DIGEST = "digest-of-the-spec"
IDS = [f"chatcmpl-wake{i}" for i in range(6)]
WARM = "chatcmpl-warm"


def _server(tmp_path, kind: str):
    proc, url = start_redis(tmp_path, kind=kind)
    client = redis.Redis.from_url(url)
    try:
        for job_id in [WARM, *IDS]:
            client.hset(
                keys.job(job_id),
                mapping={JobField.STATUS: "queued", JobField.EPOCH: 0, JobField.DIGEST: DIGEST},
            )
        yield client
    finally:
        client.close()
        proc.stop()


@pytest.fixture(params=_server_kinds())
def r(request, tmp_path):
    yield from _server(tmp_path, request.param)


@pytest.fixture
def valkey(tmp_path):
    """Valkey (as Redis 7.2+) runs a blocked XREAD again over every stream when one is
    written; Redis 7.0 answers it with the one stream that woke it, whatever we do."""
    yield from _server(tmp_path, "valkey")


def step(r: redis.Redis, linger_s: float = 0.5) -> tuple[Publisher, list]:
    """A publisher whose script is loaded, and one attempt per id."""
    pub = Publisher(Link(r, "w1", RECOVERY), linger_s=linger_s)
    claims = Claims(Link(r, "w1", RECOVERY), 3000)
    warm = claims.claim(WARM, DIGEST)
    pub.delta(warm, "w", (0,))
    pub.flush(warm)
    return pub, [claims.claim(job_id, DIGEST) for job_id in IDS]


def test_one_round_trip_wakes_the_reader_once_with_every_stream(valkey):
    r = valkey
    pub, attempts = step(r)
    reader = redis.Redis(connection_pool=r.connection_pool)
    got: list = []
    blocked = threading.Thread(
        target=lambda: got.append(reader.xread({keys.events(job_id): "$" for job_id in IDS}, block=10_000))
    )
    blocked.start()
    deadline = time.monotonic() + 5
    while not any(c.get("cmd") == "xread" for c in r.client_list()) and time.monotonic() < deadline:
        time.sleep(0.01)
    for i, a in enumerate(attempts):  # one batch step's tokens, one round trip (the linger)
        pub.delta(a, f"t{i}", (i,))
    for a in attempts:
        pub.flush(a)
    blocked.join(timeout=10)
    woken_with = got[0]
    streams = woken_with.keys() if isinstance(woken_with, dict) else [key for key, _ in woken_with]
    # One wake with every stream: not one for the first APPEND and another for the rest
    assert sorted(k.decode() for k in streams) == sorted(keys.events(job_id) for job_id in IDS)


def test_a_round_trip_whose_script_was_lost_is_sent_again_once(r):
    pub, attempts = step(r, linger_s=0.0)
    r.script_flush()  # as after a Redis restart
    for i, a in enumerate(attempts):
        pub.delta(a, f"t{i}", (i,))
    for a in attempts:
        pub.flush(a)
        assert not a.fenced and a.error is None
    for i, job_id in enumerate(IDS):
        written = [entries.decode(f) for _, f in r.xrange(keys.events(job_id))]
        assert written == [Delta(epoch=1, text=f"t{i}", token_ids=(i,))]


def test_writes_follow_a_cluster_failover_that_took_the_clients_default_node(tmp_path):
    """redis-py's cluster pipeline asks its default node where an EVALSHA's keys are (COMMAND
    GETKEYS), and does not replace that node when it is the primary that died: a worker's
    writes then failed for REDIS_WAIT_SECONDS, while the replica took over within seconds.
    The publisher names the node of each job's keys itself."""
    procs, url = start_cluster(tmp_path, masters=3, replicas=1)
    streams = sync_client(url, socket_timeout=5)
    try:
        job_id = IDS[0]
        streams.hset(
            keys.job(job_id), mapping={JobField.STATUS: "queued", JobField.EPOCH: 0, JobField.DIGEST: DIGEST}
        )
        link = Link(redis.Redis(), "w1", RECOVERY, redis_wait_s=20, streams_client=streams)
        pub = Publisher(link)
        attempt = Claims(link, 3000).claim(job_id, DIGEST)
        pub.delta(attempt, "before", (1,))
        pub.flush(attempt)
        owner = streams.get_node_from_key(keys.job(job_id))
        assert streams.execute_command("WAIT", 1, 5000, target_nodes=owner) == 1  # the replica has it
        streams.nodes_manager.default_node = owner  # the node the client asks about commands
        next(p for p in procs if p.name.endswith(f"-{owner.port}")).signal(signal.SIGKILL)
        pub.delta(attempt, "after", (2,))
        pub.flush(attempt)  # raises what the write met, had it failed for good
        rows = streams.xrange(keys.events(job_id))
        assert [entries.decode(f) for _, f in rows][-2:] == [
            Delta(epoch=1, text="before", token_ids=(1,)),
            Delta(epoch=1, text="after", token_ids=(2,)),
        ]
    finally:
        streams.close()
        for p in procs:
            p.stop()
