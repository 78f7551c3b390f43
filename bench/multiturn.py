"""Multi-turn conversations on a pool of two workers, with cache-aware routing on and off.

    .venv/bin/python bench/multiturn.py [--conversations 8] [--pairs 3] [--skewed] [--kill]
                                        [--agents] [--out bench/results/RESULTS.md]

Two workers (SLOTS=4 each, one llama.cpp thread each: the two cores shared out), the
default model. Each conversation opens with a prompt of its own of 1,000 to 2,000 tokens and
goes on with 4 short follow-ups; the turns of all conversations are sent in a shuffled,
interleaved order by 4 clients at once (a conversation's next turn after its last answer).
`--skewed`: every conversation opens with the same long system prompt (one popular prefix)
and a short question of its own: the load must stay balanced. `--kill`: a worker is
SIGKILLed (and started again, as a supervisor would) halfway through: every next turn must
still be answered. `--agents`: each conversation is an agent of its own, all at once, that
sends its next turn the moment the last answer ends (no think time): a turn is routed to its
holder only if the holder said what it holds by then.

Every turn is sent with one API key (an operator's, which reads /metrics): the key's own
prompt cache and its bound on routed jobs (ROUTED_JOBS_PER_KEY) are in play, as for a real
tenant. Two stacks run side by side, one routing (PREFIX_ROUTING=1) and one not, and every pair of
runs alternates them (ABBA), each run with conversations of its own (nothing cached from an
earlier run). Figures: follow-up TTFT p50 and p95, prompt tokens read (prefill: the workers'
counters), prompt tokens from cache, aggregate output tokens/s, routed jobs and fallbacks;
the ratios on / off with 95 % bootstrap intervals (bench/paired.py's). Writes a section of
`--out` and the same figures as JSON beside it, with a chart (bench/lib/charts.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib import charts
from bench.lib.peers_report import machine, write_section
from bench.paired import interval
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from worker.settings import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
FOLLOW_UPS = ("Say more about that.", "Why?", "Give an example.", "Sum it up in one line.")
COUNTERS = ("prefill_tokens", "cached_tokens", "prompt_tokens", "routed_taken")
CLIENTS = 4
KEY = "sk-bench-multiturn-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def opening(rng: random.Random, tag: str) -> str:
    """A prompt of its own of about 1,000 to 2,000 tokens (notes the model is asked about)."""
    notes = " ".join(
        f"Note {i} of {tag}: the {rng.choice(['red', 'green', 'blue', 'grey'])} house at number "
        f"{rng.randint(1, 999)} was painted in {rng.randint(1800, 2020)} by a "
        f"{rng.choice(['baker', 'sailor', 'clerk'])}."
        for i in range(rng.randint(28, 56))  # about 35 tokens a note
    )
    return f"Here are my notes ({tag}). {notes} What do these notes tell us?"


SHARED = "You are an assistant for a city archive. " + " ".join(
    f"Rule {i}: every answer about street {i} cites the archive's register, volume {i % 7}."
    for i in range(90)
)


class Stack:
    def __init__(self, logs: Path, routing: bool) -> None:
        self.logs, self.routing = logs, routing
        self.name = "routing on" if routing else "routing off"
        self.workers: list[Proc] = []

    def start(self) -> None:
        self.redis, self.url = start_redis(self.logs)
        env = {
            "PREFIX_ROUTING": "1" if self.routing else "0",
            "LOG_LEVEL": "WARNING",
            "API_KEYS": KEY,
            "OPERATOR_KEYS": KEY,
        }
        self.api, self.base = start_api(self.logs, self.url, env=env)
        self.workers = [self._worker() for _ in range(2)]
        wait_for_model(self.base, MODEL, procs=(self.api, *self.workers), headers=AUTH)
        deadline = time.monotonic() + 120
        while httpx.get(self.base + "/v1/models", headers=AUTH).json()["data"][0]["workers"] < 2:
            assert time.monotonic() < deadline, "the two workers did not come up"
            time.sleep(0.2)

    def _worker(self) -> Proc:
        env = {"SLOTS": "4", "N_THREADS": "1", "N_THREADS_BATCH": "1", "LOG_LEVEL": "WARNING"}
        return start_worker(self.logs, self.url, name=f"w-{uuid.uuid4().hex[:6]}", env=env)

    def kill_one(self) -> None:
        """SIGKILL a worker, then start another, as a supervisor would."""
        victim = self.workers.pop(0)
        victim.signal(signal.SIGKILL)
        self.workers.append(self._worker())

    def counters(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", headers=AUTH, timeout=10).text
        out = dict.fromkeys(COUNTERS, 0.0)
        for line in text.splitlines():
            m = re.match(r'tokenspool_(?:batch_)?(\w+?)(?:_total)?\{model="([^"]*)"\} (\S+)', line)
            if m and m[2] == MODEL and m[1] in out:
                out[m[1]] = float(m[3])
        for name in ("routed_jobs", "route_fallbacks"):
            m = re.search(rf'tokenspool_{name}_total\{{model="{re.escape(MODEL)}"\}} (\S+)', text)
            out[name] = float(m[1]) if m else 0.0
        return out

    def stop(self) -> None:
        for p in (*self.workers, self.api, self.redis):
            p.stop()


async def turn(client: httpx.AsyncClient, stack: Stack, messages: list[dict]) -> tuple[float, str, int]:
    """One turn, streamed: (TTFT, the answer, its tokens)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, ttft, text, tokens = time.perf_counter(), None, "", 0
    async with client.stream("POST", stack.base + "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"turn failed: {chunk['error']}")
            for c in chunk.get("choices") or []:
                if piece := (c.get("delta") or {}).get("content"):
                    ttft = ttft or time.perf_counter() - started
                    text += piece
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if ttft is None:
        ttft = time.perf_counter() - started
    return ttft, text, tokens


async def run(
    stack: Stack, conversations: int, skewed: bool, kill: bool, seed: int, agents: bool = False
) -> dict:
    """Every conversation's turns, 4 clients at once, in a shuffled interleaved order; or
    with `agents`, each conversation's turns back to back, all conversations at once."""
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:8]  # this run's own conversations: nothing cached before
    chats: list[list[dict]] = []
    for i in range(conversations):
        if skewed:
            chats.append(
                [
                    {"role": "system", "content": SHARED},
                    {"role": "user", "content": f"[{tag}-{i}] Street {i}?"},
                ]
            )
        else:
            chats.append([{"role": "user", "content": opening(rng, f"{tag}-{i}")}])
    order = [c for c in range(conversations) for _ in range(1 + len(FOLLOW_UPS))]
    rng.shuffle(order)  # which conversation moves next; each moves one turn at a time
    done = [0] * conversations
    ready = [asyncio.Event() for _ in range(conversations)]
    for e in ready:
        e.set()
    follow_ttfts: list[float] = []
    tokens = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for c in order:
        queue.put_nowait(c)
    killed = False
    before = stack.counters()
    started = time.perf_counter()

    async def client_task(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            c = queue.get_nowait()
            await ready[c].wait()
            ready[c].clear()
            await next_turn(client, c)
            ready[c].set()

    async def agent(client: httpx.AsyncClient, c: int) -> None:
        for _ in range(1 + len(FOLLOW_UPS)):  # no think time: the next turn at the answer's end
            await next_turn(client, c)

    async def next_turn(client: httpx.AsyncClient, c: int) -> None:
        nonlocal tokens, killed
        ttft, answer, n = await turn(client, stack, chats[c])
        tokens += n
        if done[c]:
            follow_ttfts.append(ttft)
        done[c] += 1
        if done[c] <= len(FOLLOW_UPS):
            chats[c] += [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": FOLLOW_UPS[done[c] - 1]},
            ]
        if kill and not killed and sum(done) >= len(order) // 2:
            killed = True
            await asyncio.to_thread(stack.kill_one)

    limits = httpx.Limits(max_connections=max(CLIENTS, conversations))
    timeout = httpx.Timeout(600, connect=10)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=AUTH) as client:
        if agents:
            await asyncio.gather(*(agent(client, c) for c in range(conversations)))
        else:
            await asyncio.gather(*(client_task(client) for _ in range(CLIENTS)))
    wall = time.perf_counter() - started
    after = stack.counters()
    delta = {k: after[k] - before[k] for k in after}
    follow_ttfts.sort()
    return {
        "server": stack.name,
        "streams": conversations,
        "ttft_p50": statistics.median(follow_ttfts),
        "ttft_p95": follow_ttfts[min(len(follow_ttfts) - 1, int(0.95 * len(follow_ttfts)))],
        "tok_s_total": tokens / wall,
        "prefill_tokens": delta["prefill_tokens"],
        "cached_tokens": delta["cached_tokens"],
        "prompt_tokens": delta["prompt_tokens"],
        "routed": delta["routed_jobs"],
        "fallbacks": delta["route_fallbacks"],
        "routed_taken": delta["routed_taken"],
        "follow_ups": len(follow_ttfts),
        "answered": sum(done),
        "of": len(order),
        "ok": sum(done),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--skewed", action="store_true")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--agents", action="store_true", help="one client a conversation, no think time")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    ap.add_argument(
        "--json", default="bench/results/RESULTS-multiturn.json", help="the figures, and a chart beside"
    )
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="multiturn-"))
    on, off = Stack(logs, True), Stack(logs, False)
    pairs: list[tuple[dict, dict]] = []
    try:
        for s in (on, off):
            s.start()
        for i in range(args.pairs):
            got = {}
            for s in (on, off) if i % 2 == 0 else (off, on):
                got[s.name] = await run(
                    s, args.conversations, args.skewed, args.kill, seed=i, agents=args.agents
                )
                r = got[s.name]
                print(
                    f"pair {i + 1} {s.name:>11}: follow-up TTFT p50 {r['ttft_p50'] * 1000:.0f} ms p95 "
                    f"{r['ttft_p95'] * 1000:.0f} ms, prefill {r['prefill_tokens']:.0f}, cached "
                    f"{r['cached_tokens']:.0f}, {r['tok_s_total']:.1f} tok/s, routed {r['routed']:.0f} "
                    f"(fallbacks {r['fallbacks']:.0f}), answered {r['answered']}/{r['of']}",
                    flush=True,
                )
            pairs.append((got["routing on"], got["routing off"]))
    finally:
        for s in (on, off):
            s.stop()
    report(args, pairs)


FIGURES = {
    "follow-up TTFT p50": "ttft_p50",
    "follow-up TTFT p95": "ttft_p95",
    "prompt tokens read": "prefill_tokens",
    "aggregate tok/s": "tok_s_total",
}


def cached_share(pairs: list[tuple[dict, dict]], side: int) -> float:
    return sum(p[side]["cached_tokens"] for p in pairs) / max(sum(p[side]["prompt_tokens"] for p in pairs), 1)


def report(args: argparse.Namespace, pairs: list[tuple[dict, dict]]) -> None:
    kind = ("skewed" if args.skewed else "own openings") + (", agents" if args.agents else "")
    section = (
        f"multiturn-{args.conversations}-{'skewed' if args.skewed else 'own'}"
        + ("-kill" if args.kill else "")
        + ("-agents" if args.agents else "")
    )
    cmd = f"bench/multiturn.py --conversations {args.conversations} --pairs {args.pairs}"
    cmd += (" --skewed" if args.skewed else "") + (" --kill" if args.kill else "")
    cmd += " --agents" if args.agents else ""
    lines = [
        f"## Cache-aware routing: {args.conversations} conversations, {kind}"
        + (", a worker killed" if args.kill else ""),
        "",
        f"Command: `.venv/bin/python {cmd}`, {time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        "Two workers (SLOTS=4, one thread each), "
        + ("an agent a conversation (no think time)" if args.agents else "4 clients")
        + ", 4 follow-ups a conversation of 32 tokens; "
        f"{args.pairs} pair{'s' if args.pairs > 1 else ''} of runs (ABBA), ratios on / off within each pair "
        "with 95 % bootstrap intervals.",
        "",
        "| figure | on / off (median) | 95 % interval | median on | median off |",
        "|---|---|---|---|---|",
    ]
    for label, key in FIGURES.items():
        ratios = [a[key] / b[key] for a, b in pairs if b[key]]
        lo, hi = interval(ratios) if ratios else (float("nan"), float("nan"))
        med = [statistics.median(p[side][key] for p in pairs) for side in (0, 1)]
        lines.append(
            f"| {label} | {statistics.median(ratios) if ratios else float('nan'):.3f} | {lo:.3f} - {hi:.3f} "
            f"| {med[0]:.3g} | {med[1]:.3g} |"
        )
    answered = [sum(p[side]["answered"] for p in pairs) for side in (0, 1)]
    total = sum(p[0]["of"] for p in pairs)
    lines += [
        "",
        f"Turns answered: on {answered[0]}/{total}, off {answered[1]}/{total}. Routed jobs (on): "
        f"{sum(p[0]['routed'] for p in pairs):.0f} of {sum(p[0]['follow_ups'] for p in pairs)} follow-ups, "
        f"taken by their worker "
        f"{sum(p[0]['routed_taken'] for p in pairs):.0f}, back to the shared queue "
        f"{sum(p[0]['fallbacks'] for p in pairs):.0f}. Prompt tokens from cache: on "
        f"{cached_share(pairs, 0):.0%}, off {cached_share(pairs, 1):.0%}.",
    ]
    print("\n".join(lines))
    write_section(Path(args.out), section, lines)
    results = [
        {
            **{
                k: statistics.median(p[side][k] for p in pairs)
                for k in ("ttft_p50", "ttft_p95", "tok_s_total")
            },
            "server": pairs[0][side]["server"],
            "streams": args.conversations,
            "ok": answered[side],
            "of": total,
        }
        for side in (0, 1)
    ]
    entry = {
        "title": f"multi-turn, {kind}" + (", a worker killed" if args.kill else ""),
        "command": cmd,
        "machine": machine(),
        "results": results,
        "pairs": pairs,
    }
    json_path = Path(args.json)
    charts.record(json_path, section, entry)
    charts.draw(
        by_workload(json.loads(json_path.read_text())), json_path.with_suffix(".png"), CHART, "conversations"
    )


CHART = (
    ("tok_s_total", "aggregate output tokens/s", 1.0),
    ("ttft_p50", "follow-up TTFT p50 (ms)", 1000.0),
    ("ttft_p95", "follow-up TTFT p95 (ms)", 1000.0),
)


def by_workload(data: dict) -> dict:
    """The runs' sections grouped by workload (own openings, skewed, a worker killed), each
    with its runs' results against the number of conversations: the chart's rows."""
    out: dict[str, dict] = {}
    for name, entry in sorted(data.items()):
        workload = name.split("-", 2)[2] if name.count("-") >= 2 else name
        row = out.setdefault(workload, {"title": entry["title"], "results": []})
        row["results"] += entry["results"]
    return out


if __name__ == "__main__":
    asyncio.run(main())
