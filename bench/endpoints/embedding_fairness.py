"""Fairness between keys on one embedding worker (issue 74): how long key B's one input takes
while key A floods, against B alone and one full decode.

    .venv/bin/python bench/endpoints/embedding_fairness.py [--slots 2] [--batch 256] [--floods 4]
                                                 [--inputs 300] [--probes 5] [--wait 60]

One worker (POOLING=mean, N_CTX=64, SLOTS=`--slots`, EMBEDDING_BATCH_TOKENS=`--batch`),
valkey and one API with two keys. First B alone: `--probes` one-input requests, one after
another. Then a decode: requests from A of exactly one full decode (`--batch` tokens, inputs
of 64 tokens). Then the flood: A sends `--floods` requests of `--inputs` inputs of 60 tokens
at once (with SLOTS=2 and 4 floods, two run and two wait), and while they embed, B sends
`--probes` one-input requests, one after another (each given up after `--wait` s). It prints
each figure (medians and worst) and the bound the issue sets: B's time alone plus one decode
of EMBEDDING_BATCH_TOKENS.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

A = {"Authorization": "Bearer sk-flood"}
B = {"Authorization": "Bearer sk-other"}


def embed(base: str, auth: dict, inputs, timeout: float = 600) -> float:
    started = time.monotonic()
    with httpx.Client(base_url=base, headers=auth, timeout=timeout) as c:
        resp = c.post("/v1/embeddings", json={"model": DEFAULT_MODEL_NAME, "input": inputs})
    resp.raise_for_status()
    return time.monotonic() - started


def figures(name: str, times: list[float]) -> str:
    median, worst = statistics.median(times), max(times)
    return f"{name}: median {median:.3f} s, worst {worst:.3f} s ({len(times)} requests)"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--floods", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=300)
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds B waits for an answer at most")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-embedding-fairness-"))
    redis_proc, url = start_redis(logs)
    procs = [redis_proc]
    try:
        api, base = start_api(logs, url, env={"API_KEYS": "sk-flood,sk-other", "LOG_LEVEL": "WARNING"})
        procs.append(api)
        env = {"POOLING": "mean", "N_CTX": "64", "SLOTS": str(args.slots)}
        env["EMBEDDING_BATCH_TOKENS"] = str(args.batch)
        procs.append(start_worker(logs, url, name="e1", env=env))
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=tuple(procs), headers=B, embeddings=True)
        embed(base, B, "Warm up.")
        alone = [embed(base, B, "Hello there.") for _ in range(args.probes)]
        full = [[100 + (i * 7 + j) % 500 for j in range(64)] for i in range(args.batch // 64)]
        decode = [embed(base, A, full) for _ in range(args.probes)]
        flood = [[100 + (i * 13 + j) % 500 for j in range(60)] for i in range(args.inputs)]
        ended: list[float] = []

        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):
                ended.append(embed(base, A, flood))

        floods = [threading.Thread(target=send, daemon=True) for _ in range(args.floods)]
        for t in floods:
            t.start()
        time.sleep(2.0)  # every flood taken or waiting
        during = []
        for _ in range(args.probes):
            try:
                during.append(embed(base, B, "Hello there.", timeout=args.wait))
            except httpx.TimeoutException:
                print(f"B's request was not answered within {args.wait:.0f} s")
                during.append(float("inf"))
                break
            time.sleep(0.37)  # at another point of a decode each time
        floods_ended = len(ended)
    finally:
        for p in reversed(procs):
            p.stop()
    one = statistics.median(decode) - statistics.median(alone)  # a full decode, beyond a request's cost
    print(f"worker: SLOTS={args.slots}, EMBEDDING_BATCH_TOKENS={args.batch}, N_CTX=64; logs in {logs}")
    print(figures("B alone", alone))
    print(figures(f"A, one full decode ({args.batch} tokens)", decode))
    print(f"one decode beyond a request's own cost: {one:.3f} s")
    print(figures(f"B while A floods ({args.floods} x {args.inputs} inputs)", during))
    print(f"A's floods answered meanwhile: {floods_ended} of {args.floods}")
    bound = statistics.median(alone) + one
    worst = max(during)
    print(f"bound (B alone + one decode): {bound:.3f} s; B's worst {worst:.3f} s ({worst / bound:.2f}x it)")


if __name__ == "__main__":
    main()
