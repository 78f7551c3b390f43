"""Time to first token and tokens/s of one greedy chat completion: through tokenspool (API +
queue + one worker, all on this machine) and with llama-cpp-python called directly in one
process, alternated run by run so that both see the same machine load; then what a new
worker process costs.

- warm: a long-running worker's requests, next to llama-cpp-python's.
- a new worker's first request: a worker process started, awaited until `/v1/models` lists
  it, then sent one request (and a second): against the warm TTFT (goal: within 1.25x).
- scale from zero: a request for a model with no worker, and a worker process started at
  that moment (what KEDA does): its time to first token, split by the worker's own log into
  Python start, model load, warm-up, and the rest (taking the job, prefill, first token).

Every run has a prompt of its own and the worker runs with PREFIX_CACHE=0, so that every
figure is a full prefill, like llama-cpp-python's after `reset()`.

    .venv/bin/python bench/single_stream.py [--runs 7] [--max-tokens 128] [--new-workers 5]

Prints tables of medians (and the spread). Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME, WorkerSettings

WORKER_ENV = {"PREFIX_CACHE": "0"}
_prompts = itertools.count()


def prompt() -> str:
    return f"Story {next(_prompts)}: write a long, detailed story about a lighthouse keeper and a storm."


def via_tokenspool(client: httpx.Client, max_tokens: int) -> tuple[float, float, int]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt()}],
    }
    start = time.perf_counter()
    first = last = None
    n = 0
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {resp.read()!r}")
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
    llm.reset()
    for chunk in llm.create_chat_completion(
        messages=[{"role": "user", "content": prompt()}],
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


def log_times(worker: Proc) -> dict[str, float]:
    """Wall-clock time of the worker's start-up lines (its JSON log), by message prefix."""
    found = {}
    for line in worker.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        for prefix in ("loading", "loaded in", "warm in", "worker "):
            if record["msg"].startswith(prefix):
                ts = datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
                found.setdefault(prefix, ts.replace(tzinfo=UTC).timestamp())
    return found


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--new-workers", type=int, default=5)
    args = ap.parse_args()

    from llama_cpp import Llama

    settings = WorkerSettings.from_env({"REDIS_URL": "unused"})
    logs = Path(tempfile.mkdtemp(prefix="bench-"))
    redis_proc, url = start_redis(logs, tethered=True)
    # A known model is accepted with no worker serving it (scale from zero).
    api, base = start_api(logs, url, env={"KNOWN_MODELS": DEFAULT_MODEL_NAME}, tethered=True)
    names = itertools.count(1)

    def new_worker() -> Proc:
        return start_worker(logs, url, name=f"w{next(names)}", env=WORKER_ENV, tethered=True)

    worker = new_worker()
    llm = Llama(
        model_path=str(settings.model_path),
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads,
        verbose=False,
    )
    results: dict[str, list[tuple[float, float, int]]] = {"tokenspool": [], "llama-cpp-python": []}
    first: list[float] = []
    second: list[float] = []
    cold: list[tuple[float, dict[str, float], float]] = []
    try:
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(worker, api))
        with httpx.Client(base_url=base, timeout=300) as client:
            via_tokenspool(client, 8)  # warm both paths
            via_llama(llm, 8)
            for _ in range(args.runs):
                results["tokenspool"].append(via_tokenspool(client, args.max_tokens))
                results["llama-cpp-python"].append(via_llama(llm, args.max_tokens))
            for _ in range(args.new_workers):
                worker.stop()
                worker = new_worker()
                wait_for_model(base, DEFAULT_MODEL_NAME, procs=(worker, api))
                first.append(via_tokenspool(client, args.max_tokens)[0])
                second.append(via_tokenspool(client, args.max_tokens)[0])
            for _ in range(args.new_workers):
                worker.stop()
                got: list = []
                request = threading.Thread(
                    target=lambda got=got: got.append(via_tokenspool(client, args.max_tokens))
                )
                request.start()
                time.sleep(0.2)  # the request is queued: no worker serves the model
                started = time.time()
                worker = new_worker()
                request.join(timeout=300)
                ttft_from_start = got[0][0] - 0.2  # the request came 0.2 s before the worker
                cold.append((ttft_from_start, log_times(worker), started))
    finally:
        for p in (api, worker, redis_proc):
            p.stop()

    print(
        f"{args.runs} runs each, greedy, max_tokens={args.max_tokens}, a new prompt each run, "
        "tokenspool's worker with PREFIX_CACHE=0"
    )
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
            f"{name:<18} {spread(ttft)}{'':<10} "
            f"{tokens:>6.0f} {statistics.median(decode):>13.1f} {statistics.median(e2e):>17.1f}"
        )
    (ts_ttft, ts_rate), (ll_ttft, ll_rate) = summary["tokenspool"], summary["llama-cpp-python"]
    print(f"tokenspool - direct: TTFT {ts_ttft - ll_ttft:+.1f} ms; decode rate ratio {ts_rate / ll_rate:.3f}")
    if not args.new_workers:
        return

    print(f"\na new worker process, listed in /v1/models, then requests ({args.new_workers} workers)")
    print(f"{'request':<18} {'TTFT ms (median [min-max])':<30} {'vs warm':>8}")
    for name, values in (("first", first), ("second", second)):
        ms = [v * 1000 for v in values]
        print(f"{name:<18} {spread(ms)}{'':<10} {statistics.median(ms) / ts_ttft:>7.2f}x")

    print(f"\nscale from zero: the request queued, then a worker process started ({args.new_workers} runs)")
    phases = {"python start": [], "model load": [], "warm-up": [], "job, prefill, 1st token": []}
    for ttft, t, started in cold:
        phases["python start"].append(t["loading"] - started)
        phases["model load"].append(t["loaded in"] - t["loading"])
        phases["warm-up"].append(t.get("warm in", t["loaded in"]) - t["loaded in"])
        phases["job, prefill, 1st token"].append(started + ttft - t.get("warm in", t["loaded in"]))
    print(f"{'worker start -> first token':<28} {spread([c[0] * 1000 for c in cold])} ms")
    for name, values in phases.items():
        print(f"  {name:<26} {spread([v * 1000 for v in values])} ms")


if __name__ == "__main__":
    main()
