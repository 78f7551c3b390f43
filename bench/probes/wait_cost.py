"""What waiting for a replica before relaying each entry would cost (issue 41's first option).

    .venv/bin/python bench/probes/wait_cost.py [--streams 8 32 64] [--steps 2000] [--hold 2]

docs/protocol.md ("Failover") chose to relay entries as soon as they are written and to have
the worker hold them until a replica has them. The alternative: a client is sent only
entries a replica has acknowledged. `WAIT` counts the writes of the connection that calls
it, so a relay that only reads cannot use it; the worker would `WAIT 1` after each step's
writes and then mark how far the stream is safe, and relays would read up to that mark.
This measures, on a valkey primary with one replica on loopback (the replica's link through
a TCP relay, as in tests/integration/test_failover.py), the time from a step's tokens to
their entries being readable, per step of `--streams` entries:

- `now`: one pipeline of XADDs (what the publisher does per step today);
- `wait`: the same pipeline ending in `WAIT 1 0`;
- `wait+mark`: that, then a second round trip that sets the safe mark.

Then, with the replica's link held for `--hold` seconds (a replica behind, as after every
failover until the old primary has resynced), how long the `wait+mark` step stalls: every
stream stalls with it, where today's design streams on. Prints a table of p50/p99 in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from devstack.processes import start_watched

# a Delta entry's fields, about the size the worker writes for one token (contract/entries.py)
FIELDS = {"k": "d", "t": " the", "i": "[504]", "n": "1"}


def step(r: redis.Redis, streams: int, mode: str, n: int) -> float:
    """One step's writes in `mode`; seconds until its entries may be relayed."""
    started = time.perf_counter()
    with r.pipeline(transaction=False) as pipe:
        for s in range(streams):
            pipe.xadd(f"bench:wait:{s}", FIELDS, maxlen=1000, approximate=True)
        if mode != "now":
            pipe.execute_command("WAIT", 1, 0)
        answers = pipe.execute()
    if mode != "now":
        assert answers[-1] >= 1, answers[-1]
    if mode == "wait+mark":
        r.set("bench:wait:safe", n)
    return time.perf_counter() - started


def measure(r: redis.Redis, streams: int, mode: str, steps: int) -> list[float]:
    for n in range(50):  # warm: connections, the replica's first acks
        step(r, streams, mode, n)
    return [step(r, streams, mode, n) for n in range(steps)]


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--hold", type=float, default=2.0, help="seconds the replica's link is held")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        watched = start_watched(Path(tmp), sentinels=0, held_link=True)
        assert watched.link is not None
        try:
            r = redis.Redis(port=watched.ports["primary"], socket_timeout=30)
            print("| streams | mode | p50 ms | p99 ms | mean ms |")
            print("|---|---|---|---|---|")
            for streams in args.streams:
                for mode in ("now", "wait", "wait+mark"):
                    xs = measure(r, streams, mode, args.steps)
                    mean = statistics.fmean(xs) * 1000
                    print(f"| {streams} | {mode} | {pct(xs, 0.5):.3f} | {pct(xs, 0.99):.3f} | {mean:.3f} |")
            held: list[float] = []
            timer = threading.Timer(0.2, watched.link.pause)
            timer.start()
            deadline = time.monotonic() + 0.2 + args.hold
            threading.Timer(0.2 + args.hold, watched.link.resume).start()
            n = 0
            while time.monotonic() < deadline + 0.5:
                held.append(step(r, args.streams[0], "wait+mark", n))
                n += 1
            stalled = max(held)
            print(
                f"\nreplica link held {args.hold:.1f} s: {args.streams[0]} streams, "
                f"{n} steps, longest step {stalled * 1000:.0f} ms (today: no step waits)"
            )
        finally:
            watched.link.close()
            for p in watched.procs():
                p.stop()


if __name__ == "__main__":
    main()
