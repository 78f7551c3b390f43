"""Where a first token's time goes: one stream at a time through the whole server, stage by
stage, read off Redis's MONITOR (every command the API, the worker and their Lua scripts
send, stamped by the server in microseconds) and the client's own clock (the same clock:
everything runs on this machine).

    .venv/bin/python bench/stages.py [--runs 30] [--max-tokens 16] [--batch-lines 0] \\
        [--out bench/results/RESULTS.md]

The stage boundaries, in order:

- `sent`: the client starts the POST (a kept-alive connection).
- `admitting`: the API's first command for the request (the admission's look at the model's
  workers): the body has been read, parsed and checked.
- `recorded`: RECORD writes the job's hash.
- `enqueued`: RQ's RPUSH of the job id onto the model's queue.
- `taken`: the worker's TAKE moves the id into its inbox (it was woken from its BLPOP).
- `claimed`: CLAIM marks the job running under the attempt's epoch.
- `started`: the attempt's `Started` entry: the prompt rendered and tokenized.
- `first delta`: the first `Delta` entry: prefill, the first sample, the publisher's APPEND.
- `received`: the client has parsed the first content chunk: the API's stream reader woke,
  framed the chunk and wrote it.

MONITOR costs Redis a little per command, so the TTFT here is a little above an unwatched
one's. Each request has a prompt of its own and the worker runs with PREFIX_CACHE=0, so every
prefill is whole. With `--batch-lines N` the same requests run while a Batch API batch of N
32-token lines keeps the worker busy (as in bench/batch_priority.py; the worker then keeps
its prefix cache): where an interactive first token waits for the batch. With `--repeat TEXT`
every request (the warm-up's too) sends that same prompt and the worker keeps its prefix
cache: what a prompt some slot already holds costs (only its last token is read). Run by
hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.batch_priority import batch_file
from bench.lib.peers_report import machine, write_section
from contract import keys
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

STAGES = (
    "sent",
    "admitting",
    "recorded",
    "enqueued",
    "taken",
    "claimed",
    "started",
    "first delta",
    "received",
)
WHAT = {
    "admitting": "API: read the body, parse and check it",
    "recorded": "API: admission (workers, context, queue room), RECORD",
    "enqueued": "API: RQ's enqueue",
    "taken": "worker: woken, TAKE",
    "claimed": "worker: read the spec, CLAIM",
    "started": "worker: render and tokenize the prompt, APPEND `Started`",
    "first delta": "worker: prefill, first sample, APPEND the first delta",
    "received": "API: stream reader wakes, SSE write; client parses",
}
_n = itertools.count()


class Monitor:
    """Every command Redis runs, with its time and its client, collected on a thread."""

    def __init__(self, r: redis.Redis) -> None:
        self.seen: list[dict] = []
        self._r = r
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        try:
            with self._r.monitor() as m:
                for command in m.listen():
                    self.seen.append(command)
        except redis.ConnectionError:
            pass  # the server stopped at the end of the run


def _marks(seen: list[dict], job_id: str, workers: set[str], since: float) -> dict[str, float]:
    """The stage boundaries found in the commands after `since`."""
    rules = {
        "admitting": lambda c, w: (
            not w and c["client_type"] == "tcp" and f"ts:workers:{DEFAULT_MODEL_NAME}" in c["command"]
        ),
        "recorded": lambda c, w: (
            c["command"].startswith("HSET") and f"job:{job_id}" in c["command"] and "queued" in c["command"]
        ),
        "enqueued": lambda c, w: c["command"].startswith("RPUSH rq:queue:") and job_id in c["command"],
        "taken": lambda c, w: c["command"].startswith("HSET ts:inbox:") and job_id in c["command"],
        "claimed": lambda c, w: (
            c["command"].startswith("HSET")
            and f"job:{job_id}" in c["command"]
            and " running " in c["command"]
        ),
        # APPEND writes each entry with its own id (an attempt's retry writes the same ids)
        "started": lambda c, w: bool(
            re.match(f"XADD {re.escape(keys.events(job_id))} \\S+ k s ", c["command"])
        ),
        "first delta": lambda c, w: bool(
            re.match(f"XADD {re.escape(keys.events(job_id))} \\S+ k d ", c["command"])
        ),
    }
    found: dict[str, float] = {}
    for c in seen:
        if c["time"] < since:
            continue
        from_worker = c["client_port"] in workers
        for stage, rule in rules.items():
            if stage not in found and rule(c, from_worker):
                found[stage] = c["time"]
    return found


def one(
    client: httpx.Client, monitor: Monitor, r: redis.Redis, max_tokens: int, repeat: str = ""
) -> dict[str, float]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": repeat or f"Note {next(_n)}: tell me about lighthouses."}],
    }
    times = {"sent": time.time()}
    job_id = ""
    with client.stream("POST", "/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            job_id = chunk["id"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.setdefault("received", time.time())
    time.sleep(0.1)  # the monitor thread has read every command by then
    workers = {
        c["addr"].rsplit(":", 1)[1]
        for c in r.client_list()
        if c["name"].startswith(keys.WORKER_CONNECTION_PREFIX)
    }
    times.update(_marks(monitor.seen, job_id, workers, times["sent"]))
    missing = set(STAGES) - set(times)
    if missing:
        seen = [
            c["command"][:160] for c in monitor.seen if c["time"] >= times["sent"] and job_id in c["command"]
        ]
        raise RuntimeError(
            f"{job_id}: no command marked {sorted(missing)}; its commands:\n" + "\n".join(seen)
        )
    return times


def start_batch(base: str, lines: int) -> None:
    """A batch of `lines` 32-token chat requests (bench/batch_priority.py's); returns once its
    first two are answered."""
    sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    f = sdk.files.create(file=("b.jsonl", batch_file(lines, 30_000, 32)), purpose="batch")
    batch = sdk.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    while sdk.batches.retrieve(batch.id).request_counts.completed < 2:
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--batch-lines", type=int, default=0, help="a batch of this many lines runs meanwhile")
    ap.add_argument("--repeat", default="", help="every request sends this prompt (the prefix cache on)")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="stages-"))
    redis_proc, url = start_redis(logs)
    batch_env = {"BATCH_IN_FLIGHT": "16", "BATCH_INTERVAL_SECONDS": "0.1"}
    api, base = start_api(logs, url, env={"LOG_LEVEL": "WARNING", **(batch_env if args.batch_lines else {})})
    cached = args.batch_lines or args.repeat
    worker_env = {"LOG_LEVEL": "WARNING", **({} if cached else {"PREFIX_CACHE": "0"})}
    worker = start_worker(logs, url, env=worker_env)
    rows: list[dict[str, float]] = []
    try:
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(redis_proc, api, worker))
        r = redis.Redis.from_url(url)
        monitor = Monitor(r)
        with httpx.Client(base_url=base + "/v1", timeout=60) as client:
            for _ in range(3):
                one(
                    client, monitor, r, 4, args.repeat
                )  # warm-up: the first requests page code and weights in
            if args.batch_lines:
                start_batch(base, args.batch_lines)
            for i in range(args.runs):
                rows.append(one(client, monitor, r, args.max_tokens, args.repeat))
                time.sleep(0.2)  # the worker idle again, as for a lone stream
                print(
                    f"run {i + 1}: TTFT {1000 * (rows[-1]['received'] - rows[-1]['sent']):.1f} ms", flush=True
                )
    finally:
        for p in (worker, api, redis_proc):
            p.stop()
    beside = f", a batch of {args.batch_lines} lines running" if args.batch_lines else ""
    beside += ", one prompt repeated" if args.repeat else ""
    size = ", beside the batch" if args.batch_lines else "" if args.repeat else ", PREFIX_CACHE=0"
    lines = [
        f"## Where a first token's time goes{beside} (bench/stages.py)",
        "",
        f"Command: `.venv/bin/python bench/stages.py --runs {args.runs} --max-tokens {args.max_tokens}"
        f"{f' --batch-lines {args.batch_lines}' if args.batch_lines else ''}"
        f"{f' --repeat {json.dumps(args.repeat)}' if args.repeat else ''}`, "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        f"One stream at a time through API, Redis and one worker (its default size{size}), "
        "each stage from Redis's MONITOR and the client's clock; medians and 90th percentiles of "
        "the runs, in ms.",
        "",
        "| stage | what happens | p50 ms | p90 ms |",
        "|---|---|---|---|",
    ]
    for before, after in itertools.pairwise(STAGES):
        spans = sorted(1000 * (row[after] - row[before]) for row in rows)
        p90 = spans[int(0.9 * (len(spans) - 1))]
        lines.append(f"| {before} -> {after} | {WHAT[after]} | {statistics.median(spans):.1f} | {p90:.1f} |")
    ttft = sorted(1000 * (row["received"] - row["sent"]) for row in rows)
    lines.append(
        f"| sent -> received | time to first token | {statistics.median(ttft):.1f} | "
        f"{ttft[int(0.9 * (len(ttft) - 1))]:.1f} |"
    )
    print("\n".join(lines))
    section = "stages-batch" if args.batch_lines else "stages-repeat" if args.repeat else "stages"
    write_section(Path(args.out), section, lines)


if __name__ == "__main__":
    main()
