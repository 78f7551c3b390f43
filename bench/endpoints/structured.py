"""What a grammar costs: tokens/s of a json_schema job next to a free-text one, and whether a
grammar job slows the free-text jobs sharing its batch (issue 17).

    .venv/bin/python bench/endpoints/structured.py [--rounds 5] [--tokens 96]
    .venv/bin/python bench/endpoints/structured.py --servers [--rounds 5]   # after scripts/setup_peers

On the worker's own engine (SLOTS=4, no Redis: the sampler and the batch are what is
measured), each round runs, in an order shuffled per round:

- `free alone` / `json alone`: one job, greedy, `--tokens` tokens, tok/s after the first;
- `4 free`: four free-text jobs together, the inter-token gap of each;
- `1 json + 3 free`: the same with one of them a json_schema job; the free jobs' gaps.

Before the rounds it times building the schema's grammar sampler (compiling the schema and
llama.cpp parsing the GBNF over the vocabulary), the first time in the process and after.

With `--servers`, the same free-text and json_schema requests (one at a time, streamed,
greedy) go through tokenspool (API, Redis, one worker) and through llama.cpp's llama-server
(bench/lib/peer_servers.py: same model, context and threads), alternated round by round: the
decode rate of each request (tokens after the first over the time from the first to the
last) and its time to first token.

Every prompt is new (no prefix-cache hit), and the schema bounds its strings so that the
small model's greedy answer does not loop inside one. Prints medians per case and the
ratios. Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from contract.jobspec import JobSpec, Message
from contract.schema import schema_grammar
from worker.engine.grammar import GrammarGate
from worker.engine.model import LlamaEngine
from worker.engine.protocol import Generation
from worker.settings import WorkerSettings

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
        "plot": {"type": "string", "maxLength": 300},
    },
    "required": ["title", "year", "tags", "plot"],
}
SUBJECTS = ["a lighthouse", "a storm", "a violin", "a desert city", "a glacier", "a night train", "a comet"]
_counter = itertools.count()


def _prompt(n: int) -> str:
    subject = SUBJECTS[n % len(SUBJECTS)]
    return f"Describe a film about {subject} (number {n}) with its title, year, tags and plot."


def _spec(engine: LlamaEngine, json_schema: bool, tokens: int) -> JobSpec:
    n = next(_counter)
    text = _prompt(n)
    return JobSpec(
        id=f"bench-{n}",
        kind="chat",
        model=engine.model_name,
        messages=(Message("user", text),),
        temperature=0.0,
        max_tokens=tokens,
        response_format={"type": "json_schema", "schema": SCHEMA} if json_schema else None,
    )


def _run(engine: LlamaEngine, spec: JobSpec, tokens: int, gaps: list[float], rates: list[float]) -> None:
    stamps: list[float] = []
    stream = engine.tokens(Generation(spec, engine.prompt_ids(spec)))
    try:
        for pick, _ in stream:
            stamps.append(time.perf_counter())
            if engine.is_end(pick.token) or len(stamps) >= tokens:
                break
    finally:
        stream.close()
    gaps.extend(b - a for a, b in itertools.pairwise(stamps))
    if len(stamps) > 1:
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))


def _case(engine: LlamaEngine, kinds: list[bool], tokens: int) -> tuple[list[float], list[float]]:
    """Run jobs together (True: a json_schema job); the free jobs' gaps and each job's tok/s
    (free first, then json)."""
    free_gaps: list[float] = []
    json_gaps: list[float] = []
    free_rates: list[float] = []
    json_rates: list[float] = []
    threads = [
        threading.Thread(
            target=_run,
            args=(
                engine,
                _spec(engine, is_json, tokens),
                tokens,
                json_gaps if is_json else free_gaps,
                json_rates if is_json else free_rates,
            ),
        )
        for is_json in kinds
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return free_gaps, json_rates if all(kinds) else free_rates


def _request(base: str, model: str, json_schema: bool, n: int, tokens: int) -> tuple[float, float]:
    """One streamed request: (decode tok/s, time to first token in s)."""
    import json

    import httpx

    body: dict = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(n)}],
        "temperature": 0,
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if json_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "film", "schema": SCHEMA}}
    sent = time.perf_counter()
    stamps: list[float] = []
    usage = 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        raise SystemExit(f"{base}: fewer than two content chunks")
    usage = usage or len(stamps)  # a server that sends no usage: one token a chunk
    return (usage - 1) / (stamps[-1] - stamps[0]), stamps[0] - sent


def servers(rounds: int, tokens: int) -> None:
    import tempfile

    from bench.lib.peer_servers import LlamaServer, Tokenspool

    logs = Path(tempfile.mkdtemp(prefix="structured-"))
    found = [Tokenspool(logs, 1), LlamaServer(logs)]
    rates: dict[tuple[str, bool], list[float]] = {}
    ttfts: dict[tuple[str, bool], list[float]] = {}
    n = 0
    for r in range(rounds):
        for server in found if r % 2 == 0 else found[::-1]:
            server.start()
            try:
                for json_schema in (False, True, True, False):
                    n += 1
                    rate, ttft = _request(server.base, server.model, json_schema, n, tokens)
                    rates.setdefault((server.name, json_schema), []).append(rate)
                    ttfts.setdefault((server.name, json_schema), []).append(ttft * 1000)
            finally:
                server.stop()
        print(f"round {r + 1} done", flush=True)
    print(f"\n{rounds} rounds, {tokens} tokens a request, greedy, one request at a time, medians")
    print("| server | free text tok/s | json_schema tok/s | json/free | TTFT free / json (ms) |")
    print("|---|---|---|---|---|")
    for server in found:
        free, js = (statistics.median(rates[(server.name, j)]) for j in (False, True))
        tf, tj = (statistics.median(ttfts[(server.name, j)]) for j in (False, True))
        print(f"| {server.name} | {free:.1f} | {js:.1f} | {js / free:.3f} | {tf:.0f} / {tj:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--servers", action="store_true", help="tokenspool and llama-server over HTTP")
    args = ap.parse_args()
    if args.servers:
        servers(args.rounds, args.tokens)
        return
    env = {"REDIS_URL": "unused", "SLOTS": "4", "N_CTX": "2048", "PREFIX_CACHE": "0", "WARM_UP_SECONDS": "5"}
    engine = LlamaEngine(WorkerSettings.from_env(env))
    engine.warm_up()
    setups = []
    for _ in range(5):
        t0 = time.perf_counter()
        gate = GrammarGate(engine._model.vocab, schema_grammar(SCHEMA), engine.prompts.controls)
        setups.append((time.perf_counter() - t0) * 1000)
        gate.close()
    print(f"grammar set-up: first {setups[0]:.1f} ms, then median {statistics.median(setups[1:]):.1f} ms")
    cases = {
        "free alone": [False],
        "json alone": [True],
        "4 free": [False] * 4,
        "1 json + 3 free": [True, False, False, False],
    }
    rate: dict[str, list[float]] = {name: [] for name in cases}
    itl: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.rounds):
        order = list(cases)
        random.Random(r).shuffle(order)
        for name in order:
            gaps, rates = _case(engine, cases[name], args.tokens)
            if rates:
                rate[name].append(statistics.median(rates))
            if gaps:
                itl[name].append(statistics.median(gaps) * 1000)
        print(
            f"round {r + 1}: free alone {rate['free alone'][-1]:.1f} tok/s, json alone "
            f"{rate['json alone'][-1]:.1f} tok/s; free gaps p50 {itl['4 free'][-1]:.1f} ms in 4 free, "
            f"{itl['1 json + 3 free'][-1]:.1f} ms beside a json job",
            flush=True,
        )
    med = {n: statistics.median(v) for n, v in rate.items() if v}
    gap = {n: statistics.median(v) for n, v in itl.items() if v}
    print(
        f"\n{args.rounds} rounds, {args.tokens} tokens a job, greedy, SLOTS=4, medians of per-round medians"
    )
    print(f"one job alone, tok/s: free text {med['free alone']:.1f}, json_schema {med['json alone']:.1f}")
    print(f"  json/free: {med['json alone'] / med['free alone']:.3f}")
    print(
        f"free-text jobs' inter-token gap p50: in 4 free {gap['4 free']:.1f} ms, "
        f"in 1 json + 3 free {gap['1 json + 3 free']:.1f} ms "
        f"(ratio {gap['1 json + 3 free'] / gap['4 free']:.3f})"
    )
    engine.close()


if __name__ == "__main__":
    main()
