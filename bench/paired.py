"""Is server A at least as fast as server B? Paired runs, with a confidence interval.

    .venv/bin/python bench/paired.py [--a slots8] [--b llama-server] [--streams 8] [--pairs 20]

This machine's speed drifts by more than the differences that matter (±15 % within
minutes), so a median of each server's runs taken at different times cannot tell a 3 %
difference from noise. Here every pair runs A and B back to back (in ABBA order, so that a
steady drift favours neither), the figure is the ratio within each pair, and a bootstrap
over the pairs gives a 95 % interval for the median ratio. A ratio of 1 inside the interval
means "no difference this machine can measure".

Servers: `slots8` (tokenspool, one batching worker, SLOTS=8), `slots1` (tokenspool, one
single-sequence worker) and `llama-server` (`-np 8`), as in `bench/peers.py --set batching`.
Each run is `--streams` concurrent chat streams of 128 tokens (greedy, a unique prompt tag).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer_servers import LlamaServer, Server, Tokenspool
from bench.peers import SHORT, workload

FIGURES = {"aggregate tok/s": "tok_s_total", "ITL p50": "itl_p50", "TTFT p50": "ttft_p50"}


def make(name: str, logs: Path) -> Server:
    if name == "llama-server":
        return LlamaServer(logs)
    if name in ("slots8", "slots1"):
        return Tokenspool(logs, 1, int(name[5:]))
    raise SystemExit(f"unknown server {name!r}: slots8, slots1 or llama-server")


def interval(ratios: list[float], rounds: int = 10_000, seed: int = 7) -> tuple[float, float]:
    """95 % bootstrap interval of the median ratio."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="slots8")
    ap.add_argument("--b", default="llama-server")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="paired-"))
    a, b = make(args.a, logs), make(args.b, logs)
    ratios: dict[str, list[float]] = {label: [] for label in FIGURES}
    completed = {args.a: 0, args.b: 0}
    try:
        for s in (a, b):
            s.start()
            await workload(s, args.streams, SHORT, 16)  # warm-up: page the model in
        for i in range(args.pairs):
            order = (a, b) if i % 2 == 0 else (b, a)
            got = {}
            for s in order:
                got[s] = await workload(s, args.streams, SHORT, args.max_tokens)
                completed[args.a if s is a else args.b] += got[s]["ok"]
            for label, key in FIGURES.items():
                ratios[label].append(got[a][key] / got[b][key])
            print(
                f"pair {i + 1:>2}: "
                + "  ".join(f"{label} {got[a][k]:.3g} vs {got[b][k]:.3g}" for label, k in FIGURES.items()),
                flush=True,
            )
    finally:
        for s in (a, b):
            s.stop()
    total = args.pairs * args.streams
    print(f"\n{args.a} / {args.b}, {args.streams} streams, {args.pairs} pairs (ABBA):")
    for label, rs in ratios.items():
        lo, hi = interval(rs)
        print(f"  {label:>16}: median ratio {statistics.median(rs):.3f}  95% CI [{lo:.3f}, {hi:.3f}]")
    print(f"  streams completed: {args.a} {completed[args.a]}/{total}, {args.b} {completed[args.b]}/{total}")


if __name__ == "__main__":
    asyncio.run(main())
