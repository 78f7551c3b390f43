"""Why worker/engine/batching.py lists a step's tokens by slot: the time of one 8-token decode step
on the worker's own llama.cpp context (SLOTS=8, a KV cache split by sequence) when the
batch lists the sequences in slot order and when it lists them shuffled, alternated round
by round.

    .venv/bin/python bench/probes/batch_order.py [--rounds 4] [--steps 64]

llama.cpp computes a batch for a split cache in one pass only over sequence ids that follow
each other in batch order (`split_equal(sequential=true)`); a shuffled batch takes several
passes, each reading all the weights. Prints the median step time of each round. Run by
hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llama_cpp

from worker.engine.model import LlamaEngine
from worker.settings import WorkerSettings

SLOTS, PROMPT = 8, 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    env = {
        "REDIS_URL": "unused",
        "SLOTS": str(SLOTS),
        "N_CTX": "4096",
        "N_THREADS": "1",
        "N_THREADS_BATCH": "2",
    }
    engine = LlamaEngine(WorkerSettings.from_env(env))
    ctx = engine._ctx  # the worker's own context: same cache layout and batch size
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(PROMPT, 0, 1)

    def decode(rows: list[tuple[int, int, int, bool]]) -> float:
        for i, (token, pos, seq, logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(rows)
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        return time.perf_counter() - t0

    print(f"{'round':>5} | {'order':>8} | step p50 ms | slots in batch order")
    for rnd in range(args.rounds):
        for order in ("sorted", "shuffled"):
            llama_cpp.llama_memory_clear(mem, True)
            for seq in range(SLOTS):  # every slot reads the same-length prompt
                decode([(100 + i, i, seq, i == PROMPT - 1) for i in range(PROMPT)])
            seqs = list(range(SLOTS))
            if order == "shuffled":
                while seqs == sorted(seqs):
                    random.shuffle(seqs)
            steps = [decode([(200, PROMPT + k, s, True) for s in seqs]) for k in range(args.steps)]
            print(f"{rnd:>5} | {order:>8} | {1000 * statistics.median(steps):11.1f} | {seqs}", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
