"""How fast a whole batch recovers when its worker dies, at the default worker size.

    .venv/bin/python bench/faults/batch_death.py [--streams 30] [--max-tokens 160] \\
        [--suspect-tokens 4 1000000] [--rounds 1]

One API and worker A, sized by itself (32 slots on this machine), run `--streams` greedy
chat streams; once every stream has sent a few tokens, worker B (the same size) is started
and, once it serves, A is SIGKILLed. B reads A's batch again: since issue 58 every job that
went SUSPECT_TOKENS on before the kill is requeued plain, and B takes them all at once (before,
each was a suspect, taken one at a time: api/cluster/reaper.py). Per stream it measures, at
the client, the time from the kill to the next token, and whether the stream ended whole;
and the time until the last stream ended.
Each `--suspect-tokens` value is one campaign (the workers' `SUSPECT_TOKENS`): a value
beyond `--max-tokens` never clears a suspect, which is how workers ran one suspect at a
time, to its end, before it existed.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.faults.crash_recovery import stream
from devstack.processes import start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME


def campaign(streams: int, max_tokens: int, suspect_tokens: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        redis_proc, url = start_redis(logs)
        env = {"SUSPECT_TOKENS": str(suspect_tokens)}
        api, base = start_api(logs, url, env=env)
        a = start_worker(logs, url, name="a", env=env)
        b = None
        try:
            wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api, a))
            results: list[tuple[str, list[float], bool] | None] = [None] * streams
            seen = [0] * streams

            def run(i: int) -> None:
                def on_token(_: str, n: int) -> None:
                    seen[i] = n

                results[i] = stream(base, seed * 1000 + i, max_tokens, on_token)

            threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(streams)]
            for t in threads:
                t.start()
            while min(seen) < 4:
                time.sleep(0.05)
            b = start_worker(logs, url, name="b", env=env)
            wait_for_model(base, DEFAULT_MODEL_NAME, procs=(api, a, b))
            killed = time.perf_counter()
            a.signal(signal.SIGKILL)
            a.popen.wait()
            for t in threads:
                t.join(timeout=900)
            last = time.perf_counter() - killed
            gaps, whole = [], 0
            for r in results:
                if r is None:
                    continue
                _, times, ok = r
                whole += ok
                after = [t for t in times if t > killed]
                if after:
                    gaps.append(after[0] - killed)
            return {"whole": whole, "gaps": sorted(gaps), "last": last}
        finally:
            for p in (b, a, api, redis_proc):
                if p is not None:
                    p.stop()


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--suspect-tokens", type=int, nargs="+", default=[4, 1_000_000])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    print(
        "| SUSPECT_TOKENS | round | streams whole | kill to next token p50 / p90 / max (s) "
        "| kill to last stream's end (s) |"
    )
    print("|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for n, value in enumerate(args.suspect_tokens):
            r = campaign(args.streams, args.max_tokens, value, seed=rnd * 10 + n)
            g = r["gaps"]
            p50 = statistics.median(g) if g else float("nan")
            print(
                f"| {value} | {rnd + 1} | {r['whole']}/{args.streams} | "
                f"{p50:.1f} / {pct(g, 0.9):.1f} / {max(g, default=float('nan')):.1f} | "
                f"{r['last']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
