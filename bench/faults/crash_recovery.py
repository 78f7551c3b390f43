"""How fast a stream recovers when its worker dies (SIGKILL) or hangs (SIGSTOP).

One API, greedy 96-token completions, a prompt of its own per run (so that no worker has the
run's text in its prefix cache from an earlier run). Each run signals the busy worker after
a random number of streamed tokens and measures, at the client, the time from the signal to
the next token; then checks the stream (one role chunk, one finish, [DONE]) and that its text
is the job's record (nothing lost or repeated across the takeover). Not that it equals an
uninterrupted run: the takeover reads the prompt and the text so far in one batch, and
llama.cpp's logits differ in the last bits between batch shapes, so greedy picks may part
after the cut (docs/benchmarks.md). Two ways to take over:

- `--takeover warm` (default): two workers, one of them idle and long started, always.
- `--takeover fresh`: one worker runs the stream (400 tokens, to outlast `--lead`); a new
  worker process is started with the stream, `--lead` seconds before the signal, and is the
  only one left to take the job over (what an autoscaler's replacement or a restarted pod
  meets). The job's hash says which worker claimed it after the signal: only takeovers by
  the new worker are counted, and the count is printed.

    .venv/bin/python bench/faults/crash_recovery.py [--kills 20] [--stops 5] [--seed 1] \\
        [--takeover warm|fresh] [--lead 3]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from contract import keys
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

MAX_TOKENS = 96
FRESH_MAX_TOKENS = 400  # fresh: the stream must outlast the takeover worker's `lead`


def body(run: int, max_tokens: int) -> dict:
    prompt = f"Story {run}: write a long story about a lighthouse keeper and a storm."
    return {
        "model": DEFAULT_MODEL_NAME,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


def stream(
    base: str, run: int, max_tokens: int, on_token: Callable[[str, int], None] | None = None
) -> tuple[str, list[float], bool]:
    """Returns (text, arrival time of each content chunk, ended properly)."""
    text, times, finishes, roles, done = [], [], 0, 0, False
    payload = body(run, max_tokens)
    with httpx.stream("POST", base + "/v1/chat/completions", json=payload, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "".join(text), times, False
            choice = chunk["choices"][0]
            roles += "role" in choice["delta"]
            finishes += choice["finish_reason"] is not None
            piece = choice["delta"].get("content")
            if piece:
                text.append(piece)
                times.append(time.perf_counter())
                if on_token:
                    on_token(chunk["id"], len(text))
    return "".join(text), times, done and roles == 1 and finishes == 1


def replay(base: str, job_id: str) -> str:
    """The job's text as the server recorded it (a GET from the start, once it has ended)."""
    text = []
    with httpx.stream(
        "GET", f"{base}/v1/chat/completions/{job_id}", params={"stream": "true"}, timeout=60
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                text.append(chunk["choices"][0]["delta"].get("content") or "" if chunk["choices"] else "")
    return "".join(text)


def trace(r: redis.Redis, job_id: str, state: dict) -> None:
    """After the signal: when the job went back to its queue, when a worker claimed it and
    which (polling its hash every 2 ms; the phases of the signal->next token gap)."""
    job = keys.job(job_id)
    epoch = int(r.hget(job, keys.JobField.EPOCH) or 0)
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline:
        status, now, worker = r.hmget(job, [keys.JobField.STATUS, keys.JobField.EPOCH, keys.JobField.WORKER])
        t = time.perf_counter()
        if int(now or 0) > epoch and "queued" not in state:
            state["queued"] = t
        if status == b"running" and int(now or 0) > epoch + 1:
            state.setdefault("queued", t)
            state["running"] = t
            state["claimer"] = (worker or b"").decode()
            return
        time.sleep(0.002)


class Pool:
    """The workers: named w1, w2, ...; a signalled one is reaped before it is replaced."""

    def __init__(self, logs: Path, url: str, r: redis.Redis) -> None:
        self.logs, self.url, self.r = logs, url, r
        self.workers: dict[str, Proc] = {}
        self.n = 0

    def start(self) -> Proc:
        """A new worker process, named w<n>."""
        self.n += 1
        name = f"w{self.n}"
        self.workers[name] = start_worker(self.logs, self.url, name=name, tethered=True)
        return self.workers[name]

    def reap(self, victim: Proc) -> None:
        victim.signal(signal.SIGCONT)
        victim.signal(signal.SIGKILL)
        victim.popen.wait(timeout=30)
        self.workers.pop(victim.name, None)

    def keep(self, count: int) -> None:
        """Exactly `count` workers, each listening (named connections in Redis) and idle."""
        while len(self.workers) > count:
            self.reap(next(iter(self.workers.values())))
        while len(self.workers) < count:
            self.start()
        while not self.connected(self.workers):
            time.sleep(0.1)
        time.sleep(0.5)

    def connected(self, names) -> bool:
        """Each alive (its named connections, open from its start) and serving (announced)."""
        named = {c["name"] for c in self.r.client_list()}
        serving = {n.decode() for n in self.r.zrange(keys.workers(DEFAULT_MODEL_NAME), 0, -1)}
        return all(keys.WORKER_CONNECTION_PREFIX + w in named and w in serving for w in names)

    def stop(self) -> None:
        for p in self.workers.values():
            p.signal(signal.SIGCONT)
            p.signal(signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--stops", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--takeover", choices=("warm", "fresh"), default="warm")
    ap.add_argument("--lead", type=float, default=3.0, help="fresh: seconds from its start to the signal")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    fresh = args.takeover == "fresh"

    logs = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    redis_proc, url = start_redis(logs, tethered=True)
    r = redis.Redis.from_url(url)
    api, base = start_api(logs, url, tethered=True)
    pool = Pool(logs, url, r)
    run = 0
    results = {}
    try:
        pool.keep(1 if fresh else 2)
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api,))
        for sig, runs in ((signal.SIGKILL, args.kills), (signal.SIGSTOP, args.stops)):
            gaps, kept, proper, fresh_takeovers = [], 0, 0, 0
            phases: list[tuple[float, float, float]] = []
            for _ in range(runs):
                pool.keep(1 if fresh else 2)
                run += 1
                # fresh: the takeover worker starts with the stream, which the old worker
                # takes at once (the new one loads and warms up for a second or more); the
                # signal comes `lead` s later, and after at least `cut` tokens (so that there
                # is a text to resume). Only a takeover by that new worker is counted.
                cut = rng.randint(1, 40 if fresh else 80)
                state: dict = {}
                if fresh:
                    state["fresh"] = pool.start().name
                    state["takeover"] = time.perf_counter()

                def on_token(job_id: str, count: int, cut=cut, state=state, sig=sig) -> None:
                    if "t" in state or count < cut:
                        return
                    if fresh and time.perf_counter() - state["takeover"] < args.lead:
                        return
                    name = r.hget(keys.job(job_id), keys.JobField.WORKER).decode()
                    state["victim"] = pool.workers[name]
                    state["t"] = time.perf_counter()
                    state["victim"].signal(sig)
                    state["job_id"] = job_id
                    tracer = threading.Thread(target=trace, args=(r, job_id, state), daemon=True)
                    tracer.start()

                text, times, ok = stream(base, run, FRESH_MAX_TOKENS if fresh else MAX_TOKENS, on_token)
                if "t" in state:
                    after = [t for t in times if t > state["t"]]
                    counted = not fresh or state.get("claimer") == state["fresh"]
                    fresh_takeovers += fresh and counted
                    if after and counted:
                        gaps.append(after[0] - state["t"])
                        if "running" in state:
                            phases.append(
                                (
                                    state["queued"] - state["t"],
                                    state["running"] - state["queued"],
                                    after[0] - state["running"],
                                )
                            )
                    pool.reap(state["victim"])
                proper += ok
                kept += "job_id" in state and text == replay(base, state["job_id"])
            if fresh:
                print(f"{sig.name}: {fresh_takeovers} of {runs} taken over by the freshly started worker")
            results[sig.name] = (gaps, kept, proper, runs, phases)
    finally:
        pool.stop()
        api.stop()
        redis_proc.stop()

    takeover = (
        f"a worker started {args.lead:g} s before the signal" if fresh else "a long-running idle worker"
    )
    tokens = FRESH_MAX_TOKENS if fresh else MAX_TOKENS
    print(f"takeover by {takeover}; {tokens}-token greedy streams, a new prompt each run")
    print("signal   runs  ended-properly  same-as-record  signal->next token: median   worst   (all, s)")
    for name, (gaps, kept, proper, runs, _) in results.items():
        print(
            f"{name:<8} {runs:>4}  {proper:>14}  {kept:>14}  "
            f"{statistics.median(gaps):>24.3f} {max(gaps):>7.3f}"
            f"   {' '.join(f'{g:.2f}' for g in sorted(gaps))}"
        )
    print("where the time went (medians, s): signal->requeued   requeued->claimed   claimed->next token")
    for name, (*_, phases) in results.items():
        if phases:
            parts = [statistics.median(p[i] for p in phases) for i in range(3)]
            print(f"{name:<8} {parts[0]:>30.3f} {parts[1]:>19.3f} {parts[2]:>20.3f}")


if __name__ == "__main__":
    main()
