"""A worker taking over a dead batch: how long each continuation waits for its next token,
and how long the streams already decoding there wait meanwhile (issue 58: a crash storm's
longest silences were continuations a worker held 10-20 s without a token until it died).

    .venv/bin/python bench/probes/takeover.py [--jobs 30] [--decoding 2] [--hogs 0] [--rounds 3]

The worker's own engine at the storm's sizing (32 slots of 4,096 tokens, the default
threads): `--decoding` streams decode, then `--jobs` continuations arrive at once, each a
chat prompt with 5-136 tokens already generated (as bench/faults/chaos.py's streams die), stalled
since different times. `--hogs` busy processes share the cores (a storm's replacement
workers loading beside it). Prints, per round, the tokens to read again and how many a
second were read, the continuations' waits for their first token (p50, and max: when the
whole batch goes on), and the decoding streams' longest gap.
Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from contract.jobspec import JobSpec, Message
from worker.__main__ import prepare_libgomp
from worker.engine.protocol import Generation
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from worker.engine.model import LlamaEngine

TEXT = (
    "The river runs past the old mill and under the stone bridge, where the town keeps its "
    "market on Saturdays, and the children watch the boats go down to the sea. "
) * 20


def spec(n: int, rnd: int) -> JobSpec:
    """Job `n` of round `rnd`: its own prompt, so no slot's cache holds it from an earlier round."""
    topic = ("tides", "bridges", "bread", "clocks", "owls")[n % 5]
    return JobSpec(
        id=f"takeover-{rnd}-{n}",
        kind="chat",
        model="bench",
        messages=(Message("user", f"Round {rnd}, job {n}: write a short paragraph about {topic}."),),
        temperature=0.0,
        max_tokens=400,
    )


def hog() -> None:
    while True:
        pass


def decode(engine: LlamaEngine, job: JobSpec, stop: threading.Event, stamps: list[float]) -> None:
    """A stream that decodes until told to stop (no end token ends it)."""
    job = dataclasses.replace(job, ignore_eos=True, max_tokens=3000)
    stream = engine.tokens(Generation(job, engine.prompt_ids(job)))
    try:
        for _ in stream:
            stamps.append(time.perf_counter())
            if stop.is_set():
                return
    finally:
        stream.close()


def resume(
    engine: LlamaEngine, job: JobSpec, context: list[int], since_ms: int, waits: list[float], t0: float
) -> None:
    stream = engine.tokens(Generation(job, engine.prompt_ids(job), context, since_ms=since_ms))
    try:
        next(stream)
        waits.append(time.perf_counter() - t0)
    finally:
        stream.close()


def prior(words: list[int], rng: random.Random) -> list[int]:
    """What earlier attempts generated: 5-136 tokens of text, from anywhere in it."""
    start = rng.randrange(len(words) - 136)
    return words[start : start + rng.randint(5, 136)]


def round_(engine: LlamaEngine, args: argparse.Namespace, rng: random.Random, rnd: int) -> str:
    words = list(engine._model.tokenize(TEXT.encode(), add_bos=False, special=False))
    stop = threading.Event()
    stamps: list[list[float]] = [[] for _ in range(args.decoding)]
    streams = [
        threading.Thread(target=decode, args=(engine, spec(1000 + i, rnd), stop, stamps[i]), daemon=True)
        for i in range(args.decoding)
    ]
    for t in streams:
        t.start()
    while any(len(s) < 5 for s in stamps):  # the streams decode
        time.sleep(0.05)
    waits: list[float] = []
    now_ms = int(time.time() * 1000)
    batch = [(spec(n, rnd), prior(words, rng), now_ms - rng.randint(3_000, 60_000)) for n in range(args.jobs)]
    read = sum(len(engine.prompt_ids(job)) + len(context) for job, context, _ in batch)
    t0 = time.perf_counter()
    jobs = [threading.Thread(target=resume, args=(engine, *job, waits, t0)) for job in batch]
    for t in jobs:
        t.start()
    for t in jobs:
        t.join()
    end = time.perf_counter()
    stop.set()
    for t in streams:
        t.join()
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s) if b > t0 and a < end]
    gap = f"{max(gaps):5.2f} s" if gaps else "   - "
    return (
        f"{read} tokens to read again ({read / max(waits):.0f}/s)  |  "
        f"first tokens p50 {statistics.median(waits):5.2f} s  max {max(waits):5.2f} s  |  "
        f"decoding streams' longest gap {gap}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--decoding", type=int, default=2)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    settings = WorkerSettings.from_env({"REDIS_URL": "unused", "SLOTS": "32", "N_CTX": "4096"})
    prepare_libgomp(settings)  # as the worker does, before llama.cpp loads
    from worker.engine.model import LlamaEngine  # llama.cpp loads libgomp here

    engine = LlamaEngine(settings)
    engine.warm_up()
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
    for p in hogs:
        p.start()
    rng = random.Random(args.seed)
    try:
        for r in range(args.rounds):
            print(
                f"round {r}: {args.jobs} continuations beside {args.decoding} streams, {args.hogs} hogs: "
                + round_(engine, args, rng, r),
                flush=True,
            )
    finally:
        for p in hogs:
            p.terminate()
        engine.close()


if __name__ == "__main__":
    main()
