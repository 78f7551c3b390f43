"""What the Responses API costs next to chat completions, on the same stack.

- real model, one greedy stream at a time, chat and Responses alternated run by run (each
  with a prompt of its own, PREFIX_CACHE=0): time to first token, tokens/s, bytes on the wire
  per token;
- relay cost: a synthetic worker (no model, unlimited rate) and `--streams` concurrent
  streams of `--tokens` tokens, chat then Responses: the API process's CPU seconds per 1000
  tokens relayed (its utime + stime), and the wall time;
- replay: a finished Responses stream of `--tokens` tokens fetched again whole and from
  `starting_after` near its end (every replay recomputes the events from the job's first
  entry, so the numbers never change): the time it takes, against chat's resume.

    .venv/bin/python bench/endpoints/responses.py [--runs 7] [--max-tokens 128] [--streams 50] [--tokens 200]

Prints the figures. Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

SYNTHETIC = "synthetic-bench"
_prompts = itertools.count()


def body(endpoint: str, model: str, max_tokens: int) -> tuple[str, dict]:
    text = f"Story {next(_prompts)}: write a long, detailed story about a lighthouse keeper and a storm."
    if endpoint == "chat":
        return "/v1/chat/completions", {
            "model": model,
            "stream": True,
            "max_tokens": max_tokens,
            "temperature": 0,
            "messages": [{"role": "user", "content": text}],
        }
    return "/v1/responses", {
        "model": model,
        "stream": True,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        "input": text,
    }


def stream(client: httpx.Client, endpoint: str, model: str, max_tokens: int) -> dict:
    """One streamed request: TTFT, time of the last content event, content events, bytes."""
    path, payload = body(endpoint, model, max_tokens)
    start = time.perf_counter()
    first = last = None
    contents = size = 0
    rid = ""
    with client.stream("POST", path, json=payload) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {resp.read()!r}")
        for line in resp.iter_lines():
            size += len(line) + 1
            if not line.startswith("data: {"):
                continue
            if endpoint == "chat":
                content = '"content":"' in line and '"content":""' not in line
            else:
                content = line.startswith('data: {"type":"response.output_text.delta"')
                if not rid and '"response.created"' in line:
                    rid = json.loads(line[6:])["response"]["id"]
            if content:
                now = time.perf_counter()
                first = first or now
                last = now
                contents += 1
    return {"ttft": first - start, "last": last - start, "n": contents, "bytes": size, "id": rid}


def cpu_seconds(proc: Proc) -> float:
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f} [{min(values):.2f}-{max(values):.2f}]"


def single(base: str, runs: int, max_tokens: int) -> None:
    got: dict[str, list[dict]] = {"chat": [], "responses": []}
    with httpx.Client(base_url=base, timeout=300) as client:
        stream(client, "chat", DEFAULT_MODEL_NAME, 8)  # warm the path
        for _ in range(runs):
            for endpoint in got:
                got[endpoint].append(stream(client, endpoint, DEFAULT_MODEL_NAME, max_tokens))
    print(f"\none stream at a time, real model, {runs} runs each, max {max_tokens} tokens (median [range])")
    print(f"{'endpoint':<10} {'TTFT ms':>22} {'tokens/s':>22} {'bytes/token':>22}")
    for endpoint, runs_ in got.items():
        ttft = [r["ttft"] * 1000 for r in runs_]
        rate = [(r["n"] - 1) / (r["last"] - r["ttft"]) for r in runs_]
        per = [r["bytes"] / r["n"] for r in runs_]
        print(f"{endpoint:<10} {median(ttft):>22} {median(rate):>22} {median(per):>22}")


def relay(base: str, api: Proc, streams: int, tokens: int) -> dict[str, str]:
    print(f"\nrelay cost: {streams} concurrent streams of {tokens} synthetic tokens")
    print(f"{'endpoint':<10} {'API CPU s / 1000 tokens':>24} {'wall s':>8} {'tokens':>8}")
    ids = {}
    with httpx.Client(base_url=base, timeout=300, limits=httpx.Limits(max_connections=streams + 4)) as client:
        for endpoint in ("chat", "responses"):
            for _ in range(2):  # the first round warms the path; the second is measured
                cpu, wall = cpu_seconds(api), time.perf_counter()
                with ThreadPoolExecutor(streams) as pool:
                    one = functools.partial(stream, client, endpoint, SYNTHETIC)
                    results = list(pool.map(one, [tokens] * streams))
                wall, cpu = time.perf_counter() - wall, cpu_seconds(api) - cpu
            total = sum(r["n"] for r in results)
            print(f"{endpoint:<10} {cpu / total * 1000:>24.3f} {wall:>8.2f} {total:>8}")
            ids[endpoint] = results[0]["id"]
    return ids


def replay(base: str, rid: str, tokens: int, runs: int = 20) -> None:
    with httpx.Client(base_url=base, timeout=60) as client:
        whole = client.get(f"/v1/responses/{rid}?stream=true").content
        events = whole.count(b"\nid: ")
        timings: dict[str, list[float]] = {"whole": [], "tail": []}
        for _ in range(runs):
            for name, query in (("whole", ""), ("tail", f"&starting_after={events - 5}")):
                start = time.perf_counter()
                client.get(f"/v1/responses/{rid}?stream=true{query}").raise_for_status()
                timings[name].append((time.perf_counter() - start) * 1000)
    print(
        f"\nreplay of a finished response of {tokens} tokens ({events} events, {len(whole)} bytes),"
        f" {runs} runs"
    )
    print(f"whole stream ms {median(timings['whole'])}   last 5 events ms {median(timings['tail'])}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()

    logs = Path(tempfile.mkdtemp(prefix="bench-responses-"))
    redis_proc, url = start_redis(logs, tethered=True)
    api, base = start_api(logs, url, env={"MAX_STREAMS_PER_KEY": "0"}, tethered=True)
    worker = start_worker(logs, url, env={"PREFIX_CACHE": "0"}, tethered=True)
    synthetic = start_worker(
        logs,
        url,
        name="synthetic",
        env={
            "ENGINE": "synthetic",
            "MODEL_NAME": SYNTHETIC,
            "SYNTHETIC_TOKENS": str(args.tokens),
            "SYNTHETIC_RATE": "0",
            "SLOTS": str(args.streams),
        },
        tethered=True,
    )
    try:
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api, worker))
        wait_for_model(base, SYNTHETIC, procs=(api, synthetic))
        single(base, args.runs, args.max_tokens)
        ids = relay(base, api, args.streams, args.tokens)
        replay(base, ids["responses"], args.tokens)
    finally:
        for p in (synthetic, worker, api, redis_proc):
            p.stop()


if __name__ == "__main__":
    main()
