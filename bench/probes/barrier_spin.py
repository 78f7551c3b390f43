"""How long one batched step takes beside busy processes, for each way llama.cpp's threads
may wait at a barrier: two threads spinning each of `--spins` rounds before they sleep
(libgomp's GOMP_SPINCOUNT; its own is 300,000), or one thread and no barrier at all.

    .venv/bin/python bench/probes/barrier_spin.py [--spins 300000,10000,1000,0] [--hogs 2] [--runs 5]
                                                  [--seconds 8] [--rows 16]

Each run is a fresh process (libgomp reads its settings once, when llama.cpp loads): the
default model, `--rows` tokens evaluated again and again for `--seconds`, with `--hogs`
`while True: pass` processes busy on the same cores. The settings take turns, run by run,
so a drift of the machine favours none. Prints each run's median step and, per setting, the
median over its runs and how many runs had a median step over a second. Run by hand on an
idle machine; never part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from worker.settings import default_model_path

STEP = """
import os, statistics, sys, time
import llama_cpp
threads = int(os.environ["THREADS"])
llm = llama_cpp.Llama(sys.argv[1], n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False)
text = b"The quick brown fox jumps over the lazy dog, again and again."
tokens = (llm.tokenize(text) * 8)[: int(sys.argv[3])]
steps, end = [], time.monotonic() + float(sys.argv[2])
while time.monotonic() < end or not steps:
    llm.reset()
    started = time.perf_counter()
    llm.eval(tokens)
    steps.append(time.perf_counter() - started)
print(statistics.median(steps), len(steps))
"""


def run(model: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[float, int]:
    """One process's median step (s) and how many steps it took, beside the hogs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        argv = [sys.executable, "-c", STEP, str(model), str(args.seconds), str(args.rows)]
        out = subprocess.run(argv, env=clean | env, capture_output=True, text=True, check=True, timeout=600)
        median, steps = out.stdout.split()
        return float(median), int(steps)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--spins", default="300000,10000,1000,0")
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rows", type=int, default=16)
    args = parser.parse_args()
    model = default_model_path()
    if model is None:
        raise SystemExit("the default model is not installed (scripts/setup)")
    print(f"{args.rows}-row steps beside {args.hogs} busy processes, {os.cpu_count()} CPUs")
    settings = {f"spin {n}": {"GOMP_SPINCOUNT": n, "THREADS": "2"} for n in args.spins.split(",")}
    settings["one thread"] = {"THREADS": "1"}
    medians: dict[str, list[float]] = {name: [] for name in settings}
    for i in range(args.runs):
        for name, env in settings.items():
            median, steps = run(model, env, args)
            medians[name].append(median)
            print(f"run {i + 1} {name:24s} step p50 {median * 1000:8.1f} ms ({steps} steps)", flush=True)
    print("\nsetting                  median of the runs' p50   runs over 1 s")
    for name, values in medians.items():
        slow = sum(v > 1.0 for v in values)
        print(f"{name:24s} {statistics.median(values) * 1000:10.1f} ms {slow:14d} / {len(values)}")


if __name__ == "__main__":
    main()
