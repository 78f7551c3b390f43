"""How fast a stream recovers when its worker dies (SIGKILL) or hangs (SIGSTOP).

One API, two workers (one idle), greedy 96-token completions. Each run kills the busy worker
after a random number of streamed tokens and measures, at the client, the time from the
signal to the next token; then checks the stream (one role chunk, one finish, [DONE]) and
compares its text with an uninterrupted run. The killed worker is replaced before the next
run, so an idle worker always exists.

    .venv/bin/python bench/crash_recovery.py [--kills 20] [--stops 5] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import redis

from contract import keys
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

BODY = {
    "model": DEFAULT_MODEL_NAME,
    "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}],
    "max_tokens": 96,
    "temperature": 0,
    "stream": True,
}


def stream(base: str, on_token=None) -> tuple[str, list[float], bool]:
    """Returns (text, arrival time of each content chunk, ended properly)."""
    text, times, finishes, roles, done = [], [], 0, 0, False
    with httpx.stream("POST", base + "/v1/chat/completions", json=BODY, timeout=120) as resp:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--stops", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    logs = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    redis_proc, url = start_redis(logs)
    r = redis.Redis.from_url(url)
    api, base = start_api(logs, url)
    workers: dict[str, Proc] = {}
    doomed: set[str] = set()
    n = 0

    def ensure_two() -> None:
        nonlocal n
        for name, p in list(workers.items()):
            if name in doomed:
                p.popen.wait(timeout=30)  # a signalled process is not gone until reaped
            if not p.alive():
                del workers[name]
        while len(workers) < 2:
            n += 1
            workers[f"w{n}"] = start_worker(logs, url, name=f"w{n}")
        while True:
            named = {c["name"] for c in r.client_list()}
            if all(keys.WORKER_CONNECTION_PREFIX + w in named for w in workers):
                time.sleep(0.5)  # model loaded and listening
                return
            time.sleep(0.1)

    try:
        ensure_two()
        wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api,))
        reference, _, ok = stream(base)
        assert ok
        results = {}
        for sig, runs in ((signal.SIGKILL, args.kills), (signal.SIGSTOP, args.stops)):
            gaps, exact, proper = [], 0, 0
            for _ in range(runs):
                ensure_two()
                cut = rng.randint(1, 80)
                state: dict = {}

                def on_token(cid: str, count: int, cut=cut, state=state, sig=sig) -> None:
                    if count == cut:
                        name = r.hget(keys.job(cid), keys.JobField.WORKER).decode()
                        state["victim"] = workers[name]
                        doomed.add(name)
                        state["t"] = time.perf_counter()
                        state["victim"].signal(sig)

                text, times, ok = stream(base, on_token)
                if "t" in state:
                    after = [t for t in times if t > state["t"]]
                    if after:
                        gaps.append(after[0] - state["t"])
                if sig == signal.SIGSTOP and "victim" in state:
                    state["victim"].signal(signal.SIGCONT)
                    state["victim"].signal(signal.SIGKILL)  # replaced by ensure_two
                proper += ok
                exact += text == reference
            results[sig.name] = (gaps, exact, proper, runs)
    finally:
        for p in workers.values():
            p.signal(signal.SIGKILL)
        api.stop()
        redis_proc.stop()

    print("signal   runs  ended-properly  exact-text  kill->next token: median   worst   (all, s)")
    for name, (gaps, exact, proper, runs) in results.items():
        print(
            f"{name:<8} {runs:>4}  {proper:>14}  {exact:>10}  "
            f"{statistics.median(gaps):>22.3f} {max(gaps):>7.3f}"
            f"   {' '.join(f'{g:.2f}' for g in sorted(gaps))}"
        )


if __name__ == "__main__":
    main()
