"""What confirming a claim on the replicas costs (worker/attempts/rules.py `_settle_claim`).

    .venv/bin/python bench/probes/claim_wait.py [--rounds 2000]

Before an attempt writes anything a client could be sent, it waits until the replicas hold
its claim: one round trip of a write (its BEAT) and `WAIT n`, instead of none. On a valkey
primary with one replica on loopback, this times a pipelined write alone and the same write
followed by `WAIT 1` (which returns once the replica acknowledges it). Prints p50 and p99 in
ms; the difference is what each claim costs while the replica keeps up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devstack.processes import start_redis


def timed(client: redis.Redis, rounds: int, wait: bool) -> list[float]:
    out = []
    for n in range(rounds):
        started = time.perf_counter()
        with client.pipeline(transaction=False) as pipe:
            pipe.set("claim", n)
            if wait:
                pipe.execute_command("WAIT", 1, 250)
            replies = pipe.execute()
        out.append((time.perf_counter() - started) * 1000)
        if wait and replies[1] != 1:
            raise SystemExit("the replica did not acknowledge a write")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        primary, url = start_redis(Path(tmp))
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        replica, replica_url = start_redis(Path(tmp), extra=("--replicaof", "127.0.0.1", str(port)))
        try:
            with redis.Redis.from_url(replica_url) as r:
                while r.info("replication").get("master_link_status") != "up":
                    time.sleep(0.1)
            with redis.Redis.from_url(url) as client:
                print("| round trip | p50 (ms) | p99 (ms) |\n|---|---|---|")
                for label, wait in (("a write", False), ("a write, then WAIT 1", True)):
                    ms = sorted(timed(client, args.rounds, wait))
                    p99 = ms[int(len(ms) * 0.99) - 1]
                    print(f"| {label} | {statistics.median(ms):.3f} | {p99:.3f} |")
        finally:
            for p in (replica, primary):
                p.stop()


if __name__ == "__main__":
    main()
