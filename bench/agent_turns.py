"""Agent sessions beyond the slots: how fast a follow-up's first token comes once its
session's prefix is out of every slot (issue 76), with the worker's host tier on and off.

    .venv/bin/python bench/agent_turns.py [--conversations 8] [--follow-ups 2] [--tokens 8]
                                          [--prefix-tokens 1500] [--peer]
    .venv/bin/python bench/agent_turns.py --workers 2 [--conversations 16]

One worker, SLOTS=4 and N_CTX=4096 (bench/lib/peer_servers.py's threads: one for a token's
step, two for prefill). Each conversation opens with a system prompt of its own of about
`--prefix-tokens` tokens; all are advanced round-robin (every opening, then every first
follow-up, ...) by one client, greedy, `--tokens` tokens an answer, each answer put back in
the history as an agent does. With more conversations than slots each follow-up finds its
prefix written out of the slots: the tier restores it (HOST_CACHE_MIB unset: sized from the
machine's memory), or, off (HOST_CACHE_MIB=0), the worker reads it again. A third run reads a
lone prompt 64 tokens a step (PREFILL_ALONE=64, the reading before it), to show what reading
it 512 a step does to the openings. `--peer` adds
llama-server (`-np 4`, its default `--cache-ram`) built from the worker's own llama.cpp
(`llama-server-worker`, scripts/setup_peers), where it is installed. Prints opening TTFT p50,
follow-up TTFT p50 and p90, the whole run, the prompt tokens the usage says were cached, and
whether every answer was the same in each server.

`--workers 2` runs two workers of SLOTS=4 instead, with cache-aware routing on and then off
(PREFIX_ROUTING=0). With more conversations than the 8 slots, a follow-up's prefix is in one
worker's host tier, and routing must send it there. It adds the follow-ups routed to a
worker, and those sent back to the shared queue, from /metrics.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peer_servers import LlamaServer, Server, Tokenspool
from worker.settings import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
QUESTIONS = ("What is the first step?", "And then?", "Why that order?", "Sum it up.", "Anything else?")


def system_prompt(rng: random.Random, n: int, tokens: int) -> str:
    """Session n's own system prompt, of about `tokens` tokens (an agent's tools and rules)."""
    rules = " ".join(
        f"Rule {i} of agent {n}: the {rng.choice(['read', 'write', 'grep', 'test'])} tool takes a "
        f"{rng.choice(['path', 'pattern', 'command'])} and returns at most {rng.randint(10, 999)} lines."
        for i in range(tokens // 30)  # about 30 tokens a rule
    )
    return f"You are coding agent {n}. {rules}"


def turn(base: str, messages: list[dict], tokens: int) -> tuple[float, str, int]:
    """One turn, streamed: (TTFT in s, the answer, the prompt tokens the usage says were cached)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, ttft, text, cached = time.perf_counter(), None, "", 0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content") and ttft is None:
                    ttft = time.perf_counter() - started
                text += (choice.get("delta") or {}).get("content") or ""
            if usage := chunk.get("usage"):
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft if ttft is not None else time.perf_counter() - started, text, cached


def run(server: Server, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)  # every server gets the same conversations
    histories = [
        [{"role": "system", "content": system_prompt(rng, n, args.prefix_tokens)}]
        for n in range(args.conversations)
    ]
    openings, follow_ups, answers, cached = [], [], [], 0
    started = time.perf_counter()
    for r in range(1 + args.follow_ups):
        for history in histories:
            history.append({"role": "user", "content": QUESTIONS[r % len(QUESTIONS)]})
            ttft, text, hit = turn(server.base, history, args.tokens)
            history.append({"role": "assistant", "content": text})
            (openings if r == 0 else follow_ups).append(ttft)
            answers.append(text)
            cached += hit
    whole = time.perf_counter() - started
    routed = _routing(server.base)
    return {
        "routed": routed.get("routed_jobs", 0.0),
        "fallbacks": routed.get("route_fallbacks", 0.0),
        "openings": openings,
        "follow_ups": follow_ups,
        "whole": whole,
        "answers": answers,
        "cached": cached,
    }


def _routing(base: str) -> dict[str, float]:
    """The pool's routed jobs and fallbacks so far (0 where /metrics has none: one worker)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    found = re.findall(
        rf'tokenspool_(routed_jobs|route_fallbacks)_total\{{model="{re.escape(MODEL)}"\}} (\S+)', text
    )
    return {name: float(value) for name, value in found}


def servers(logs: Path, args: argparse.Namespace) -> list[tuple[str, Server]]:
    if args.workers > 1:
        n = args.workers
        return [
            (f"{n} workers, routing on", Tokenspool(logs, n, slots=4, env={"PREFIX_ROUTING": "1"})),
            (f"{n} workers, PREFIX_ROUTING=0", Tokenspool(logs, n, slots=4, env={"PREFIX_ROUTING": "0"})),
        ]
    found: list[tuple[str, Server]] = [
        ("tokenspool, host tier on", Tokenspool(logs, 1, slots=4)),
        ("tokenspool, HOST_CACHE_MIB=0", Tokenspool(logs, 1, slots=4, worker_env={"HOST_CACHE_MIB": "0"})),
        # a lone prompt read PREFILL_CHUNK tokens a step, as before PREFILL_ALONE
        ("tokenspool, PREFILL_ALONE=64", Tokenspool(logs, 1, slots=4, worker_env={"PREFILL_ALONE": "64"})),
    ]
    if args.peer:
        peer = LlamaServer(logs, parallel=4, same=True)
        if peer.binary().exists():
            found.append(("llama-server -np 4", peer))
        else:
            print(f"llama-server skipped: no {peer.binary()} (scripts/setup_peers builds it)")
    return found


def p(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--follow-ups", type=int, default=2, help="rounds of follow-ups after the openings")
    parser.add_argument("--tokens", type=int, default=8, help="tokens an answer")
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=76)
    parser.add_argument("--peer", action="store_true", help="llama-server too, where it is installed")
    parser.add_argument("--workers", type=int, default=1, help="2: routing on and off, two workers")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="agent-turns-"))
    results = {}
    for name, server in servers(logs, args):
        server.start()
        try:
            results[name] = run(server, args)
        finally:
            server.stop()
    print(
        f"{args.conversations} conversations of ~{args.prefix_tokens}-token prefixes on "
        f"{args.workers} x SLOTS=4, "
        f"{args.follow_ups} follow-up rounds, {args.tokens} tokens an answer, one client, greedy"
    )
    head = f"{'':30} {'opening p50':>12} {'follow-up p50':>14} {'p90':>8} {'whole run':>10} {'cached':>8}"
    print(head + f" {'routed':>7} {'fallbacks':>9}")
    for name, r in results.items():
        opening, follow_up = statistics.median(r["openings"]), statistics.median(r["follow_ups"])
        print(
            f"{name:30} {opening:11.2f}s {follow_up:13.2f}s "
            f"{p(r['follow_ups'], 90):7.2f}s {r['whole']:9.1f}s {r['cached']:8d} "
            f"{r['routed']:7.0f} {r['fallbacks']:9.0f}"
        )
    first = next(iter(results.values()))["answers"]
    for name, r in results.items():
        same = sum(a == b for a, b in zip(first, r["answers"], strict=True))
        print(f"{name}: {same}/{len(first)} answers as the first server's")


if __name__ == "__main__":
    main()
