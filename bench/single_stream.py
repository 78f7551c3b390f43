"""Time to first token and tokens/s of one greedy 128-token chat completion: through
tokenspool (API + queue + one worker, all on this machine) and with llama-cpp-python called
directly in one process, alternated run by run so that both see the same machine load.

    .venv/bin/python bench/single_stream.py [--runs 7] [--max-tokens 128]

Prints a table of medians (and the spread). Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME, WorkerSettings

PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."


def via_tokenspool(client: httpx.Client, max_tokens: int) -> tuple[float, float, int]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": PROMPT}],
    }
    start = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    return first - start, last - start, n


def via_llama(llm, max_tokens: int) -> tuple[float, float, int]:
    start = time.perf_counter()
    first = last = None
    n = 0
    llm.reset()  # tokenspool prefills every job from scratch too
    for chunk in llm.create_chat_completion(
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        max_tokens=max_tokens,
        temperature=0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
    ):
        if chunk["choices"][0]["delta"].get("content"):
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    return first - start, last - start, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    from llama_cpp import Llama

    settings = WorkerSettings.from_env({"REDIS_URL": "unused"})
    logs = Path(tempfile.mkdtemp(prefix="bench-"))
    redis_proc, url = start_redis(logs)
    worker = start_worker(logs, url)
    api, base = start_api(logs, url)
    llm = Llama(
        model_path=str(settings.model_path),
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads,
        verbose=False,
    )
    results: dict[str, list[tuple[float, float, int]]] = {"tokenspool": [], "llama-cpp-python": []}
    try:
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(worker, api))
        with httpx.Client(base_url=base, timeout=300) as client:
            via_tokenspool(client, 8)  # warm both paths
            via_llama(llm, 8)
            for _ in range(args.runs):
                results["tokenspool"].append(via_tokenspool(client, args.max_tokens))
                results["llama-cpp-python"].append(via_llama(llm, args.max_tokens))
    finally:
        for p in (api, worker, redis_proc):
            p.stop()

    print(f"{args.runs} runs each, greedy, max_tokens={args.max_tokens}, prompt {PROMPT!r}")
    print(
        f"{'path':<18} {'TTFT ms (median [min-max])':<30} {'tokens':>6} "
        f"{'decode tok/s':>13} {'end-to-end tok/s':>17}"
    )
    summary = {}
    for name, runs in results.items():
        ttft = [r[0] * 1000 for r in runs]
        decode = [(r[2] - 1) / (r[1] - r[0]) for r in runs]
        e2e = [r[2] / r[1] for r in runs]
        tokens = statistics.median(r[2] for r in runs)
        summary[name] = (statistics.median(ttft), statistics.median(decode))
        print(
            f"{name:<18} {statistics.median(ttft):7.1f} [{min(ttft):.1f}-{max(ttft):.1f}]{'':<10} "
            f"{tokens:>6.0f} {statistics.median(decode):>13.1f} {statistics.median(e2e):>17.1f}"
        )
    (ts_ttft, ts_rate), (ll_ttft, ll_rate) = summary["tokenspool"], summary["llama-cpp-python"]
    print(f"tokenspool - direct: TTFT {ts_ttft - ll_ttft:+.1f} ms; decode rate ratio {ts_rate / ll_rate:.3f}")


if __name__ == "__main__":
    main()
