"""Where the two cores go during bench/paired.py's run: the CPU time of every process of a
server (and of this client), thread by thread, over one run of `--streams` streams.

    .venv/bin/python bench/probes/cpu_split.py [--server defaults|same8|...] [--streams 8] [--runs 3]

llama.cpp's threads are the generating process's two busiest (they spin on their cores);
everything else (tokenspool's API, Redis and the worker's job threads; llama-server's HTTP
threads; the client) runs on the same two cores and holds a step back while it runs.
Prints, per run and as medians: seconds of CPU per group and their share of the run's wall
time. Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.paired import make
from bench.peers import SHORT, workload
from bench.scale_out import cpu_s


def threads_cpu(pids: list[int]) -> dict[tuple[int, int], float]:
    """(pid, tid) -> CPU seconds (user + system) so far."""
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                out[(pid, int(task.name))] = cpu_s(pid, int(task.name))
    return out


def groups(server, before: dict, after: dict) -> dict[str, float]:
    """CPU seconds by group: llama.cpp's threads, each other process of the server, the client."""
    names = {p.pid: p.name.split("-")[0] for p in server.procs}
    names[os.getpid()] = "client"
    generating = server.procs[-1].pid  # the worker (tokenspool) or the server itself
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    busiest = sorted((k for k in used if k[0] == generating), key=used.get, reverse=True)[:2]
    out: dict[str, float] = defaultdict(float)
    for key, seconds in used.items():
        if key in busiest:
            out["llama.cpp threads"] += seconds
        elif key[0] == generating and server.name.startswith("tokenspool"):
            out["worker, other threads"] += seconds
        elif key[0] == generating:
            out["server, other threads"] += seconds
        else:
            out[names[key[0]]] += seconds
    return dict(out)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="defaults")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    server = make(args.server, Path(tempfile.mkdtemp(prefix="cpu-split-")))
    runs: list[tuple[float, dict[str, float]]] = []
    try:
        server.start()
        await workload(server, args.streams, SHORT, 16)  # warm-up: page the model in
        for i in range(args.runs):
            pids = [*server.pids(), os.getpid()]
            before, started = threads_cpu(pids), time.perf_counter()
            result = await workload(server, args.streams, SHORT, args.max_tokens)
            wall = time.perf_counter() - started
            split = groups(server, before, threads_cpu(pids))
            runs.append((wall, split))
            shares = ", ".join(f"{k} {100 * v / wall:.1f} %" for k, v in sorted(split.items()))
            print(f"run {i + 1}: {result['tok_s_total']:.1f} tok/s, {wall:.2f} s; CPU of one core: {shares}")
    finally:
        server.stop()
    print(f"\n{server.name}, {args.streams} streams, medians of {args.runs} runs (% of one core):")
    for key in sorted({k for _, split in runs for k in split}):
        seconds = statistics.median(split.get(key, 0.0) for _, split in runs)
        share = statistics.median(100 * split.get(key, 0.0) / wall for wall, split in runs)
        print(f"  {key:<24} {seconds:6.2f} s  {share:5.1f} %")


if __name__ == "__main__":
    asyncio.run(main())
