"""The ceiling of bench/paired.py's figure: the same workload decoded by llama.cpp in this
process, with nothing around it (no HTTP, no queue, no client), alternated pair by pair with
llama-server, so the ratio says how far ahead of llama-server any server could be on this
machine with these kernels.

    .venv/bin/python bench/ceiling.py [--streams 8] [--pairs 6] [--b same8] [--out bench/results/RESULTS.md]

The in-process run does what a server does for bench/paired.py's run of `--streams` chat
streams: each sequence keeps the chat template's system prompt cached from an earlier
request (as every server's slot does), reads the rest of its prompt (a unique tag, as
bench/peers.py sends), then decodes greedily in one batch, one token per sequence a step,
until its end token or `--max-tokens`; threads, context per sequence, KV layout and flash
attention as the worker sets them. Its tokens/s is every token over the time from the
prompts' step to the last token. llama-server's is bench/paired.py's (content chunks over
the wall time of the run, its client on the same cores).

A server cannot beat the in-process run: it adds its own work (HTTP, sampling bookkeeping,
for tokenspool the API, Redis and the job threads) on the two cores llama.cpp's threads
spin on, and each millisecond of it holds a step back by about as much (docs/benchmarks.md).
Run by hand; never part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaModel

from bench.lib.peer_servers import CTX, THREADS, THREADS_BATCH
from bench.lib.peers_report import machine, write_section
from bench.paired import interval, make
from bench.peers import SHORT, workload
from contract.jobspec import JobSpec, Message
from worker.engine import llama_log
from worker.engine.prompts import ChatPrompts
from worker.settings import DEFAULT_MODEL_NAME, default_model_path


class InProcess:
    """llama.cpp with `streams` sequences, each with the system prompt's prefix cached."""

    def __init__(self, streams: int) -> None:
        llama_log.install()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        self.model = LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)
        self.prompts = ChatPrompts(self.model)
        self.n_vocab = self.model.n_vocab()
        self.streams = streams
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_seq_max, cparams.kv_unified = streams * CTX, streams, False
        cparams.n_batch, cparams.n_ubatch = 2048, 512
        cparams.n_threads, cparams.n_threads_batch = int(THREADS), int(THREADS_BATCH)
        self.ctx = llama_cpp.llama_init_from_model(self.model.model, cparams)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(4096, 0, 1)
        a, b = self.prompt(), self.prompt()
        self.prefix = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        self.decode([(s, i, a[i], False) for s in range(streams) for i in range(self.prefix)])

    def prompt(self) -> list[int]:
        message = Message("user", f"[{uuid.uuid4().hex[:8]}] {SHORT}")
        spec = JobSpec(id="ceiling", kind="chat", model=DEFAULT_MODEL_NAME, messages=(message,))
        return self.prompts.prompt_ids(spec, CTX)

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for n, (seq, pos, token, logits) in enumerate(rows):
            b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = token, pos, 1, logits
            b.seq_id[n][0] = seq
        b.n_tokens = len(rows)
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise SystemExit("llama_decode failed")

    def greedy(self, index: int) -> int:
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, index), shape=(self.n_vocab,))
        return int(row.argmax())

    def run(self, max_tokens: int) -> float:
        """One run of the workload; its tokens/s."""
        prompts = [self.prompt() for _ in range(self.streams)]
        for s in range(self.streams):
            llama_cpp.llama_memory_seq_rm(self.mem, s, self.prefix, -1)
        started = time.perf_counter()
        rows = [
            (s, i, p[i], i == len(p) - 1) for s, p in enumerate(prompts) for i in range(self.prefix, len(p))
        ]
        self.decode(rows)
        last = {s: n for n, (s, _, _, logits) in enumerate(rows) if logits}
        pos = {s: len(p) for s, p in enumerate(prompts)}
        made = dict.fromkeys(range(self.streams), 0)
        while last:
            step = []
            for s, index in last.items():
                token = self.greedy(index)
                made[s] += 1
                if not self.prompts.is_end(token) and made[s] < max_tokens:
                    step.append((s, pos[s], token, True))
                    pos[s] += 1
            if not step:
                break
            self.decode(step)
            last = {s: n for n, (s, _, _, _) in enumerate(step)}
        return sum(made.values()) / (time.perf_counter() - started)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--b", default="", help="the server to compare with (default same<streams>)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    args = ap.parse_args()
    name = args.b or f"same{args.streams}"
    inproc = InProcess(args.streams)
    server = make(name, Path(tempfile.mkdtemp(prefix="ceiling-")))
    pairs: list[tuple[float, float]] = []
    try:
        server.start()
        await workload(server, args.streams, SHORT, 16)  # warm-up: page the model in
        inproc.run(16)
        for i in range(args.pairs):
            got: dict[str, float] = {}
            for side in ("in", "b") if i % 2 == 0 else ("b", "in"):
                if side == "in":
                    got[side] = inproc.run(args.max_tokens)
                else:
                    got[side] = (await workload(server, args.streams, SHORT, args.max_tokens))["tok_s_total"]
            pairs.append((got["in"], got["b"]))
            print(f"pair {i + 1:>2}: in-process {got['in']:.1f} vs {got['b']:.1f} tok/s", flush=True)
    finally:
        server.stop()
    ratios = [a / b for a, b in pairs]
    lo, hi = interval(ratios)
    lines = [
        f"## The ceiling: llama.cpp in-process against {server.name}, {args.streams} streams",
        "",
        f"Command: `.venv/bin/python bench/ceiling.py --streams {args.streams} --pairs {args.pairs}`, "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        f"{args.pairs} pairs (ABBA) of bench/paired.py's workload ({args.streams} greedy chat streams of "
        f"{args.max_tokens} tokens), once decoded in one process with nothing around llama.cpp and once "
        "through the server: what no server can beat on these cores.",
        "",
        "| | median ratio | 95 % interval | in-process tok/s | server tok/s |",
        "|---|---|---|---|---|",
        f"| in-process / server | {statistics.median(ratios):.3f} | {lo:.3f} - {hi:.3f} | "
        f"{statistics.median(a for a, _ in pairs):.1f} | {statistics.median(b for _, b in pairs):.1f} |",
    ]
    print("\n".join(lines))
    write_section(Path(args.out), f"ceiling-{name}-{args.streams}", lines)


if __name__ == "__main__":
    asyncio.run(main())
