"""tokenspool next to the servers users would run instead, same machine, same model, one run.

    scripts/setup_peers                       # once: llama-cpp-python[server], llama-server
    .venv/bin/python bench/peers.py [--runs 5] [--out bench/results/RESULTS.md] [--set peers|batching]
                                    [--only LABEL] [--services-nice N]

Servers (all with the default SmolLM2 GGUF, 4096 tokens of context per sequence, greedy
sampling, one llama.cpp thread for a one-token step and two for prefill and batched steps,
which is llama-cpp-python's server's default on two cores):
- tokenspool with one worker, and with two workers (embedded valkey, API, workers; two
  workers take one thread each for batches too: the two cores are shared out);
- llama-cpp-python's OpenAI server (`python -m llama_cpp.server`);
- llama.cpp's `llama-server` (`-np 8`: eight parallel sequences, its default style of serving).

Workloads (`--set peers`): one stream with a short and with a ~1,000-token prompt (128 output
tokens), 8 and 32 concurrent streams, and a crash: the process generating a stream is
SIGKILLed mid-stream (tokenspool: its worker; peers: the server), then restarted at once as a
supervisor would. `--set batching` compares one batching worker (SLOTS=8) with one
single-sequence worker (SLOTS=1) and both peers at 1, 4, 8 and 16 concurrent streams.
Each run alternates the servers, so every ratio compares figures taken minutes apart.

Figures: time to first token and inter-token latency (p50, p99), output tokens/s per stream
and aggregate, streams completed correctly (ending with `data: [DONE]`, every event valid
JSON, no error), peak RSS of each server's processes. Writes a Markdown table (with the
command and the machine) and a PNG of latency against concurrency next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peer_servers import Server, servers_for
from bench.lib.peers_report import cells, write_results

SHORT = "Write a long, detailed story about a lighthouse keeper and a storm."
LONG = (
    "Here are my notes on the history of lighthouses, please read them carefully. "
    + " ".join(
        f"Note {i}: the lighthouse on island number {i} was built of stone in the year {1700 + i} "
        f"and its keeper kept a log of every ship that passed during storms."
        for i in range(38)
    )
    + " Now write a long story inspired by these notes."
)


@dataclass
class Result:
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each content (or thinking) chunk arrived
    tokens: int = 0
    ok: bool = False
    error: str = ""
    started: float = 0.0
    ended: float = 0.0


async def one_stream(
    client: httpx.AsyncClient,
    server: Server,
    prompt: str,
    max_tokens: int,
    extra: dict | None = None,
    tag: bool = True,
) -> Result:
    # A unique tag before the question: no server may answer a whole prompt from its cache
    # (all three keep the KV cache of a shared prefix: with the tag, only the chat
    # template's system prompt is shared). `tag=False`: the prompt as it is, repeated.
    content = f"[{uuid.uuid4().hex[:8]}] {prompt}" if tag else prompt
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        **(extra or {}),  # `ignore_eos`: every server generates exactly max_tokens
    }
    res = Result(started=time.perf_counter())
    last = None
    done = False
    try:
        async with client.stream("POST", server.base + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"].get("code") or "error"
                    continue
                choices = chunk.get("choices") or []
                delta = (choices[0].get("delta") or {}) if choices else {}
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                    now = time.perf_counter()
                    res.times.append(now)
                    if last is None:
                        res.ttft = now - res.started
                    else:
                        res.gaps.append(now - last)
                    last = now
                    res.tokens += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = type(exc).__name__
    res.ended = time.perf_counter()
    res.ok = done and not res.error and res.tokens > 0
    return res


class PeakRSS:
    """Samples the summed RSS of a server's processes every 50 ms."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            total = 0
            for pid in self.pids:
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
                except OSError:
                    pass
            self.peak_kb = max(self.peak_kb, total)


async def workload(
    server: Server,
    streams: int,
    prompt: str,
    max_tokens: int,
    crash: bool = False,
    extra: dict | None = None,
    tag: bool = True,
) -> dict:
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10), limits=limits) as client:
        with PeakRSS(server.pids()) as rss:
            t0 = time.perf_counter()
            tasks = [
                asyncio.create_task(one_stream(client, server, prompt, max_tokens, extra, tag))
                for _ in range(streams)
            ]
            if crash:
                await asyncio.sleep(1.5)  # mid-stream: the first tokens are out
                server.kill_generating()
                # as a supervisor would: a new worker (tokenspool) or the server (peers)
                await asyncio.to_thread(server.recover)
            results = await asyncio.gather(*tasks)
            wall = time.perf_counter() - t0
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    gaps = sorted(g for r in results for g in r.gaps)
    per_stream = [(r.tokens - 1) / sum(r.gaps) for r in results if r.gaps and sum(r.gaps) > 0]
    return {
        "ok": sum(r.ok for r in results),
        "streams": streams,
        "errors": sorted({r.error for r in results if r.error}),
        "ttft_p50": _pct(ttfts, 50),
        "ttft_p95": _pct(ttfts, 95),
        "ttft_p99": _pct(ttfts, 99),
        "itl_p50": _pct(gaps, 50),
        "itl_p99": _pct(gaps, 99),
        "tok_s_stream": statistics.median(per_stream) if per_stream else 0.0,
        "tok_s_total": sum(r.tokens for r in results) / wall,
        "rss_mb": rss.peak_kb / 1024,
    }


def _pct(values: list[float], p: int) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(len(values) * p / 100) - 1))]


WORKLOADS = {
    "peers": [
        ("1 stream, short prompt", 1, SHORT, 128, False),
        ("1 stream, ~1,000-token prompt", 1, LONG, 128, False),
        ("8 streams", 8, SHORT, 128, False),
        ("32 streams", 32, SHORT, 128, False),
        ("worker/server SIGKILLed mid-stream, 4 streams", 4, SHORT, 128, True),
    ],
    "batching": [(f"{n} stream{'s' if n > 1 else ''}", n, SHORT, 128, False) for n in (1, 4, 8, 16)],
}


def median_of(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in runs)
    out["ok"] = sum(r["ok"] for r in runs)
    out["streams"] = sum(r["streams"] for r in runs)
    out["errors"] = sorted({e for r in runs for e in r["errors"]})
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="alternated repetitions of each workload")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    ap.add_argument("--only", default="", help="run only the workloads whose label contains this")
    ap.add_argument("--set", default="peers", choices=sorted(WORKLOADS), help="which comparison")
    ap.add_argument(
        "--services-nice",
        type=int,
        default=0,
        help="run tokenspool's Redis and API at this nice value (as if on other cores)",
    )
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="peers-"))
    servers = servers_for(args.set, logs, args.services_nice)
    table: dict[str, dict[str, dict]] = {}
    try:
        for s in servers:
            s.start()
            await workload(s, 1, SHORT, 8)  # warm-up: page the model in
        for label, n, prompt, max_tokens, crash in [w for w in WORKLOADS[args.set] if args.only in w[0]]:
            runs: dict[str, list[dict]] = {s.name: [] for s in servers}
            for _ in range(1 if crash else args.runs):
                for s in servers:
                    runs[s.name].append(await workload(s, n, prompt, max_tokens, crash))
            table[label] = {name: median_of(rs) for name, rs in runs.items()}
            for name, r in table[label].items():
                print(f"{label:>48} | {name:>24} | " + " | ".join(cells(r)), flush=True)
    finally:
        for s in servers:
            s.stop()
    names = [s.name for s in servers]
    write_results(Path(args.out), args.set, table, args.runs, names, args.services_nice, args.only)


if __name__ == "__main__":
    asyncio.run(main())
