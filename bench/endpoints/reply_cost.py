"""What reading a reply costs per generated token: the Python a job thread spends splitting
thinking, answer and calls (worker/text/), next to what a token takes to decode.

    .venv/bin/python bench/endpoints/reply_cost.py [--tokens 20000] [--decode-ms 20]

Feeds a long answer, a few characters a token (as a model's tokens come), through each reply:
plain text, a `<think>` block then the answer (Thinking), and gpt-oss's harmony messages
(Harmony), and prints microseconds per token and that share of a `--decode-ms` step (a
SmolLM2 token on two cores is ~20 ms; a GPU step of 64 rows ~15 ms).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from worker.text.harmony import Harmony
from worker.text.replies import PlainReply
from worker.text.thinking import Thinking

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "17", "<", "19", "|")


def pieces(tokens: int, head: str, middle: str) -> list[str]:
    """`head`, then thinking words, `middle`, then answer words: one piece a token."""
    body = [f" {WORDS[i % len(WORDS)]}" for i in range(tokens)]
    half = tokens // 2
    return [head, *body[:half], middle, *body[half:]]


def cost(make, chunks: list[str], rounds: int = 3) -> float:
    """Microseconds per piece, the best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        reply = make()
        started = time.perf_counter()
        for chunk in chunks:
            reply.feed(chunk)
        reply.end()
        best = min(best, (time.perf_counter() - started) / len(chunks) * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20_000)
    ap.add_argument("--decode-ms", type=float, default=20.0)
    args = ap.parse_args()
    n = args.tokens
    cases = {
        "plain": (PlainReply, pieces(n, "", "")),
        "think": (lambda: Thinking(PlainReply(), opened=False), pieces(n, "<think>", "</think>\n\n")),
        "harmony": (
            lambda: Harmony(PlainReply(), "chatcmpl-x"),
            pieces(
                n, "<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>"
            ),
        ),
    }
    print(f"`bench/endpoints/reply_cost.py --tokens {n} --decode-ms {args.decode_ms}`")
    print("| reply | µs per token | share of a decode step |")
    print("|---|---|---|")
    for name, (make, chunks) in cases.items():
        us = cost(make, chunks)
        print(f"| {name} | {us:.2f} | {us / (args.decode_ms * 1000):.3%} |")


if __name__ == "__main__":
    main()
