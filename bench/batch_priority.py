"""Batch API lines beside interactive streams on one worker: does a saturating batch slow the
interactive path, and how fast does the batch go?

One API, Redis and one worker (`--slots`, default 4, `0`: unset, the worker sizes itself;
BATCH_SLOTS, BATCH_PREFILL_CHUNK, BATCH_LEND_AFTER_SECONDS and BATCH_LEND_SLOTS from the
environment, default SLOTS - 1 up to 8, 8, 2 s and half the slots):

- idle: `--probes` interactive streamed requests, one after another: time to first token;
- the same probes while a batch of `--lines` requests (`--line-tokens` tokens each) keeps the
  worker busy: their time to first token (goal: p50 and p95 within 1.5x of idle);
- the batch's throughput (completion tokens over the time from its first line's start to
  its last line's end) against the interactive path's best aggregate: SLOTS concurrent
  streams of the same requests (`--best-streams` with `--slots 0`) (goal: at least 0.9x).

Then `--pairs` pairs of back-to-back runs, in ABBA order: a batch of `--pair-lines` lines
with nothing beside it, and the interactive best over as many requests; the ratio is taken
within each pair.

The idle probes and the interactive best are measured before the batch and again after it,
and each figure is taken over both: this machine's speed drifts by 10 % within minutes, and
a single idle measurement moved the ratios as much as any setting did. Every request and
line has its own number of the same five digits: prompts of one length, and none found
whole in a slot's cache from an earlier run.

    .venv/bin/python bench/batch_priority.py [--lines 200] [--line-tokens 32] [--probes 20] [--probe-gap 0.3]
        [--pairs 4] [--pair-lines 96]

Prints the figures. Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

IN_FLIGHT = 16  # BATCH_IN_FLIGHT: lines of a batch queued or running at once


def request(i: int, max_tokens: int) -> dict:
    return {
        "model": DEFAULT_MODEL_NAME,
        "messages": [
            {"role": "user", "content": f"Tale {i}: tell me about a lighthouse keeper and a storm."}
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def ttft(client: httpx.Client, i: int) -> float:
    """One streamed request, read to its end as a client does (the connection is reused)."""
    start = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json={**request(i, 16), "stream": True}) as resp:
        for line in resp.iter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no content")
    return first


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def probes(client: httpx.Client, n: int, start: int, gap_s: float) -> list[float]:
    out = []
    for k in range(n):
        out.append(ttft(client, start + k) * 1000)
        time.sleep(gap_s)
    return out


def interactive_aggregate(client: httpx.Client, slots: int, tokens: int, rounds: int, first: int) -> float:
    """Completion tokens per second with `slots` concurrent non-streamed requests, numbered
    from `first`: give every call its own numbers, as every batch has its own lines, or a
    repeated prompt finds itself in a slot's cache (PREFIX_CACHE) and skips its reading."""

    def one(i: int) -> int:
        return client.post("/v1/chat/completions", json=request(first + i, tokens)).json()["usage"][
            "completion_tokens"
        ]

    start = time.perf_counter()
    with ThreadPoolExecutor(slots) as pool:
        total = sum(pool.map(one, range(slots * rounds)))
    return total / (time.perf_counter() - start)


def batch_file(n: int, start: int, tokens: int) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": request(i, tokens),
            }
        )
        + "\n"
        for i in range(start, start + n)
    ).encode()


def batch_alone(sdk: openai.OpenAI, n: int, start: int, tokens: int) -> float:
    """Completion tokens per second of a batch of `n` lines with nothing beside it, from its
    creation to its completed status on the client's clock (the batch's own clock counts
    whole seconds). The client looks once a second until the last lines run, then every
    50 ms: looking 20 times a second throughout took about 4 % from the batch on two cores
    (the API and the client answering), which the interactive best's waiting clients do not."""
    f = sdk.files.create(file=("b.jsonl", batch_file(n, start, tokens)), purpose="batch")
    began = time.perf_counter()
    b = sdk.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    while (b := sdk.batches.retrieve(b.id)).status != "completed":
        left = n - b.request_counts.completed - b.request_counts.failed
        time.sleep(1.0 if left > IN_FLIGHT else 0.05)
    took = time.perf_counter() - began
    assert b.output_file_id is not None
    out = [json.loads(x) for x in sdk.files.content(b.output_file_id).text.splitlines()]
    return sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out) / took


def paired(
    sdk: openai.OpenAI, client: httpx.Client, pairs: int, lines: int, streams: int, tokens: int
) -> list[tuple[float, float]]:
    """(batch rate, interactive best rate) for each pair of back-to-back runs of the same
    requests, in ABBA order: the ratio within a pair does not see the machine's drift."""
    out = []
    for k in range(pairs):
        rates: dict[str, float] = {}
        for what in ("batch", "best") if k % 2 == 0 else ("best", "batch"):
            if what == "batch":
                rates[what] = batch_alone(sdk, lines, 20_000 + 2000 * k, tokens)
            else:
                rounds = max(lines // streams, 1)
                rates[what] = interactive_aggregate(client, streams, tokens, rounds, 21_000 + 2000 * k)
        out.append((rates["batch"], rates["best"]))
        print(f"pair {k + 1}: batch {rates['batch']:.1f}, best {rates['best']:.1f} tok/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--line-tokens", type=int, default=32)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--slots", type=int, default=4, help="the worker's SLOTS (0: unset, sized by the worker)")
    ap.add_argument(
        "--best-streams", type=int, default=16, help="with --slots 0: streams for the best aggregate"
    )
    ap.add_argument(
        "--probe-gap",
        type=float,
        default=0.3,
        help="seconds between probes during the batch; above BATCH_LEND_AFTER_SECONDS every probe "
        "finds the batch in its lent slots (and calls one back if BATCH_LEND_SLOTS is every slot)",
    )
    ap.add_argument(
        "--pairs", type=int, default=4, help="pairs of a batch alone and the interactive best, after"
    )
    ap.add_argument("--pair-lines", type=int, default=96, help="lines in each pair's batch")
    args = ap.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    redis_proc, url = start_redis(logs, tethered=True)
    api, base = start_api(
        logs, url, env={"BATCH_IN_FLIGHT": str(IN_FLIGHT), "BATCH_INTERVAL_SECONDS": "0.1"}, tethered=True
    )
    worker = start_worker(logs, url, env={"SLOTS": str(args.slots)} if args.slots else {}, tethered=True)
    streams = args.slots or args.best_streams
    sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    try:
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api, worker))
        with httpx.Client(base_url=base, timeout=300) as client:
            probes(client, 3, 0, 0.1)  # warm
            rounds = max(args.lines // 40, 3)
            idle = probes(client, args.probes, 100, 0.3)
            best_before = interactive_aggregate(client, streams, args.line_tokens, rounds, 10_000)
            f = sdk.files.create(
                file=("b.jsonl", batch_file(args.lines, 30_000, args.line_tokens)), purpose="batch"
            )
            batch = sdk.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while sdk.batches.retrieve(batch.id).request_counts.completed < 2:
                time.sleep(0.05)
            busy = probes(client, args.probes, 200, args.probe_gap)
            while (b := sdk.batches.retrieve(batch.id)).status != "completed":
                time.sleep(0.2)
            idle += probes(client, args.probes, 300, 0.3)
            best_after = interactive_aggregate(client, streams, args.line_tokens, rounds, 15_000)
            pairs = paired(sdk, client, args.pairs, args.pair_lines, streams, args.line_tokens)
        best = (best_before + best_after) / 2
        out = [json.loads(x) for x in sdk.files.content(b.output_file_id).text.splitlines()]
        tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in out)
        rate = tokens / (b.completed_at - b.in_progress_at)  # whole seconds: the batch's own clock
        took = b.completed_at - b.in_progress_at
        p50, p95 = pct(busy, 50) / pct(idle, 50), pct(busy, 95) / pct(idle, 95)
        print(
            f"\nidle worker, {len(idle)} probes (before and after): "
            f"TTFT p50 {pct(idle, 50):.0f} ms, p95 {pct(idle, 95):.0f} ms"
        )
        print(
            f"during the batch, {len(busy)} probes {args.probe_gap} s apart: "
            f"p50 {pct(busy, 50):.0f} ms, p95 {pct(busy, 95):.0f} ms"
        )
        print(f"ratio p50 {p50:.2f}x, p95 {p95:.2f}x (goal <= 1.5x)")
        print(f"batch: {len(out)} lines, {tokens} tokens in {took} s = {rate:.1f} tok/s")
        print(
            f"interactive best ({streams} streams) {best:.1f} tok/s (before {best_before:.1f}, "
            f"after {best_after:.1f}); ratio {rate / best:.2f} (goal >= 0.9)"
        )
        if pairs:
            ratios = sorted(b / i for b, i in pairs)
            print(
                f"a batch of {args.pair_lines} lines alone against the interactive best, {len(pairs)} pairs: "
                f"ratio median {statistics.median(ratios):.2f} (from {ratios[0]:.2f} to {ratios[-1]:.2f}); "
                f"batch median {statistics.median(b for b, _ in pairs):.1f}, "
                f"best median {statistics.median(i for _, i in pairs):.1f} tok/s"
            )
    finally:
        for p in (worker, api, redis_proc):
            p.stop()


if __name__ == "__main__":
    main()
