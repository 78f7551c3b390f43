"""A long prompt arriving while streams decode: do the running streams stall while it is read?

    .venv/bin/python bench/mixed_load.py [--rounds 3] [--streams 8] [--notes 75]
                                         [--servers defaults,same16] [--out bench/results/RESULTS.md]

Each round, on each server in turn: `--streams` streams start (greedy, 512 tokens each); 3 s
later, when every one decodes, one request with a ~3,000-token prompt (`--notes`
notes of ~39 tokens) and `max_tokens=1` arrives. The figures: the running streams'
inter-token gaps before it arrived (their median), their gaps while it was read (from its
request to its first token: p50, p99, max), the p99 over that median (the goal: at most 2),
and the long prompt's time to first token. Servers are named as in bench/paired.py; the
llama-server needs a slot for the long prompt beside the streams (`same16`: -np 16).
Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peer_servers import Server
from bench.lib.peers_report import machine, write_section
from bench.paired import NAMES, make
from bench.peers import SHORT, one_stream


def long_prompt(notes: int) -> str:
    return (
        "Here are my notes on the history of lighthouses, please read them carefully. "
        + " ".join(
            f"Note {i}: the lighthouse on island number {i} was built of stone in the year {1700 + i} "
            f"and its keeper kept a log of every ship that passed during storms."
            for i in range(notes)
        )
        + " Now say which island had the oldest lighthouse."
    )


async def one_round(server: Server, streams: int, notes: int) -> dict:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits) as client:
        running = [asyncio.create_task(one_stream(client, server, SHORT, 512)) for _ in range(streams)]
        await asyncio.sleep(3.0)  # past every stream's prefill (about 0.7 s for 8): all decode
        sent = time.perf_counter()
        long = await one_stream(client, server, long_prompt(notes), 1)
        first = sent + (long.ttft or 0.0)
        results = await asyncio.gather(*running)
    before, during = [], []
    for r in results:
        for a, b in zip(r.times, r.times[1:], strict=False):
            if b <= sent:
                before.append(b - a)
            elif a >= sent and b <= first:
                during.append(b - a)
    during.sort()
    base = statistics.median(before)
    return {
        "itl_before_p50": base,
        "itl_during_p50": statistics.median(during) if during else float("nan"),
        "itl_during_p99": during[int(0.99 * (len(during) - 1))] if during else float("nan"),
        "itl_during_max": during[-1] if during else float("nan"),
        "ratio": (during[int(0.99 * (len(during) - 1))] / base) if during else float("nan"),
        "long_ttft": long.ttft or float("nan"),
        "long_ok": long.ok,
        "streams_ok": sum(r.ok for r in results),
        "gaps_during": len(during),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--notes", type=int, default=75)
    ap.add_argument("--servers", default="defaults,same16")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="mixed-"))
    names = args.servers.split(",")
    got: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.rounds):
        for name in names if i % 2 == 0 else reversed(names):
            server = make(name, logs)
            server.start()
            try:
                await one_round(server, 2, 4)  # warm-up: page the model in
                got[name].append(await one_round(server, args.streams, args.notes))
            finally:
                server.stop()
            r = got[name][-1]
            print(
                f"round {i + 1} {name}: ITL before {1000 * r['itl_before_p50']:.0f} ms, during p50 "
                f"{1000 * r['itl_during_p50']:.0f} p99 {1000 * r['itl_during_p99']:.0f} max "
                f"{1000 * r['itl_during_max']:.0f} ms ({r['ratio']:.2f}x), long TTFT {r['long_ttft']:.2f} s",
                flush=True,
            )
    lines = [
        f"## A ~3,000-token prompt arriving while {args.streams} streams decode (bench/mixed_load.py)",
        "",
        f"Command: `.venv/bin/python bench/mixed_load.py --rounds {args.rounds} --streams {args.streams} "
        f"--notes {args.notes} --servers {args.servers}`, {time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        "Each round starts the server, runs its streams (greedy, 512 tokens), and sends the long prompt "
        "(max_tokens 1) once they decode; the servers alternate. ITL in ms: the streams' median gap "
        "before it arrived, and their gaps while it was read (from its request to its first token). "
        "Medians over the rounds.",
        "",
        "| server | ITL before, p50 | ITL while it is read: p50 / p99 / max | p99 / before "
        "| long prompt TTFT s | completed |",
        "|---|---|---|---|---|---|",
    ]
    for name, rounds in got.items():

        def med(key: str, rounds: list[dict] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        done = sum(r["streams_ok"] for r in rounds)
        lines.append(
            f"| {NAMES.get(name, name)} | {1000 * med('itl_before_p50'):.0f} | "
            f"{1000 * med('itl_during_p50'):.0f} / {1000 * med('itl_during_p99'):.0f} / "
            f"{1000 * med('itl_during_max'):.0f} | {med('ratio'):.2f}x | {med('long_ttft'):.2f} | "
            f"{done}/{args.streams * len(rounds)} streams, "
            f"{sum(r['long_ok'] for r in rounds)}/{len(rounds)} long |"
        )
    print("\n".join(lines))
    write_section(Path(args.out), f"mixed-{args.streams}", lines)


if __name__ == "__main__":
    asyncio.run(main())
