"""The worker's own work per batch step, measured on a CPU with a stand-in for the GPU.

    .venv/bin/python bench/step_overhead.py [--rows 64,128,256] [--vocab 128256] [--decode-ms 6]
                                            [--steps 150] [--sampled] [--jobs] [--tree DIR]

The real scheduler (worker/engine/batching.py) steps `rows` sequences through `StandIn`: a
context whose decode takes `--decode-ms` without the GIL (as a GPU's step does; on a GPU
llama.cpp's decode returns early and the wait is in the read of the logits, here all of it
is in the decode), and whose logits are `--vocab` wide (Llama 3's 128,256 by default). The
sequences are greedy with `ignore_eos`'s bias, as bench/gpu_run's are; `--sampled` makes
them temperature 0.8, top-p 0.95, seeded. Per step, in decode-only steps:

- `scheduler CPU`: the scheduler thread's CPU time (its clock, so the stand-in's sleep is not
  in it); `logits pass`: the argmax over the step's rows as the scheduler takes it (on its
  threads, worker/engine/argmax.py), timed alone on the same array, the fastest of 15: the
  pass no worker can skip; `rest`: the scheduler's CPU less its own part of that pass
  (planning, the batch, picks, bookkeeping, handing the tokens on);
- with `--jobs`, one job thread per sequence doing what a job thread does with each token
  before the publisher (worker/text: the stop-string assembler and the reply) and `wall over
  decode`: the step's wall time less the stand-in's decode, i.e. what the GPU would wait for
  each step, GIL contention included. Publishing to Redis is not in it.

`--model GGUF` times one temperature row's pick instead: llama_sampler_sample on a real
context (before) against Sampler.sample on the step's array (now), same chain and seed.

`--tree DIR` runs the same against another checkout of the project (e.g. a `git worktree`
of an earlier commit): a scheduler from before worker/engine/context.py is driven through a
stand-in for the llama_cpp module instead (bench/results/RESULTS.md has both).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import statistics
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


class StandIn:
    """What the scheduler asks of a llama.cpp context: a decode of a set time, logits of a
    set vocabulary (random, fixed: a GPU writes them without the CPU), caches that hold
    nothing."""

    def __init__(self, vocab: int, rows: int, decode_s: float, sampled: bool = False) -> None:
        self.n_vocab = vocab
        self.sampled = sampled
        self.decode_s = decode_s
        self.table = np.random.default_rng(0).standard_normal((rows, vocab), dtype=np.float32)
        self.slept = 0.0
        self.interrupt = _NoInterrupt()

    def decode(self, batch) -> int:
        started = time.perf_counter()
        time.sleep(self.decode_s)
        self.slept += time.perf_counter() - started
        return 0

    def logits(self, rows: int) -> np.ndarray:
        return self.table[:rows]

    def remove(self, slot: int, start: int = 0) -> None:
        pass

    def copy(self, src: int, dst: int) -> None:
        pass

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        pass

    def clear(self) -> None:
        pass


class _NoInterrupt:
    def arm(self, armed: bool) -> None:
        pass

    def fire(self) -> bool:
        return False

    def take(self) -> bool:
        return False


def _old_llama(real, stand_in: StandIn) -> types.SimpleNamespace:
    """A stand-in for the llama_cpp module, for a scheduler that called it directly: the same
    functions on `stand_in`; llama_batch_init is the real one (a plain allocation)."""
    rows_of: dict[int, int] = {}  # batch index -> logits row

    def decode(ctx, batch) -> int:
        rows_of.clear()
        for i in range(batch.n_tokens):
            if batch.logits[i]:
                rows_of[i] = len(rows_of)
        return stand_in.decode(batch)

    def logits_ith(ctx, i: int):
        address = stand_in.table.ctypes.data + rows_of[i] * stand_in.n_vocab * 4
        return ctypes.cast(address, ctypes.POINTER(ctypes.c_float))

    def nothing(*args, **kw) -> None:
        return None

    shim = types.SimpleNamespace(
        **{name: getattr(real, name) for name in dir(real) if not name.startswith("__")}
    )
    shim.llama_decode, shim.llama_get_logits_ith = decode, logits_ith
    for name in ("llama_get_memory", "llama_memory_seq_rm", "llama_memory_seq_cp", "llama_memory_clear"):
        setattr(shim, name, nothing)
    shim.llama_set_abort_callback = nothing
    return shim


def scheduler(tree: Path | None, stand_in: StandIn, rows: int):
    """The tree's Scheduler stepping `rows` slots through `stand_in`, and its module."""
    if tree is not None:
        sys.path.insert(0, str(tree.resolve()))
    batching = importlib.import_module("worker.engine.batching")
    args = dict(slots=rows, prefill_chunk=8, is_end=lambda token: False, prefix_cache=False)
    if importlib.util.find_spec("worker.engine.context") is not None and hasattr(batching, "pick_rows"):
        return batching.Scheduler(stand_in, **args), batching
    import llama_cpp

    if stand_in.sampled:
        raise SystemExit(
            "--sampled needs a tree with worker/engine/context.py: llama_sampler_sample needs a context"
        )
    shim = _old_llama(llama_cpp, stand_in)
    batching.llama_cpp = shim
    importlib.import_module("worker.engine.sampling").llama_cpp = shim
    importlib.import_module("worker.engine.interrupt").llama_cpp = shim
    return batching.Scheduler(None, **args), batching


def sequences(batching, rows: int, vocab: int, sampled: bool) -> list:
    from contract.jobspec import JobSpec
    from worker.engine.sampling import Sampler

    ends = ((0, -100.0), (2, -100.0))  # ignore_eos: the end tokens biased out, as the worker does
    out = []
    for i in range(rows):
        spec = JobSpec(
            id=f"s{i}",
            kind="completion",
            model="stand-in",
            prompt="x",
            temperature=0.8 if sampled else 0.0,
            top_p=0.95 if sampled else 1.0,
            seed=i,
            logit_bias=ends,
            ignore_eos=True,
        )
        sampler = Sampler(spec, vocab, 4096)
        out.append(batching.Sequence(context=[1 + i % 7, 3], sampler=sampler, room=1 << 30))
    return out


def consume(seq, stop: threading.Event, stopped: type[Exception]) -> None:
    """A job thread's own work on each token before the publisher (worker/attempts/rules.py)."""
    from worker.text.replies import PlainReply
    from worker.text.textstream import TextAssembler

    assembler, reply, said = TextAssembler(("</s>",)), PlainReply(), []
    try:
        for pick in seq:
            piece = assembler.push(pick.token, f" w{pick.token % 1000}".encode())
            if piece is not None:
                said.append(reply.feed(piece.text).content)
            if stop.is_set():
                return
    except stopped:  # the scheduler stopped under it: the run is over
        return


def drain(seq, stop: threading.Event, stopped: type[Exception]) -> None:
    """A job thread that takes its tokens and does nothing with them."""
    try:
        for _ in seq:
            if stop.is_set():
                return
    except stopped:
        return


def measure(args, rows: int) -> dict:
    stand_in = StandIn(args.vocab, rows, args.decode_ms / 1000, args.sampled)
    sched, batching = scheduler(args.tree, stand_in, rows)
    seqs = sequences(batching, rows, args.vocab, args.sampled)
    stop = threading.Event()
    work = consume if args.jobs else drain
    failed = batching.EngineFailed
    threads = [threading.Thread(target=work, args=(s, stop, failed), daemon=True) for s in seqs]
    for t in threads:
        t.start()
    for s in seqs:
        sched.submit(s)
    while min(s.generated for s in seqs) < 3:  # every prompt read: decode-only steps from here
        time.sleep(0.005)
    clock = time.pthread_getcpuclockid(sched._thread.ident)
    c0, s0, w0, d0 = time.clock_gettime(clock), sched.counters.steps, time.perf_counter(), stand_in.slept
    while sched.counters.steps - s0 < args.steps:
        time.sleep(0.01)
    c1, s1, w1, d1 = time.clock_gettime(clock), sched.counters.steps, time.perf_counter(), stand_in.slept
    stop.set()
    for s in seqs:
        sched.close(s)
    sched.stop()
    steps = s1 - s0
    table = stand_in.table[:rows]
    argmax = lambda rows: rows.argmax(axis=1).tolist()  # noqa: E731 - a scheduler from before argmax.py
    if hasattr(sched, "_argmax"):  # as the step takes it, on as many threads (the scheduler's are shut)
        argmax = importlib.import_module("worker.engine.argmax").RowsArgmax(sched._argmax.threads)
    passes, own = [], []
    for _ in range(15):
        started, cpu = time.perf_counter(), time.thread_time()
        argmax(table)
        passes.append(time.perf_counter() - started)
        own.append(time.thread_time() - cpu)
    cpu_ms = (c1 - c0) / steps * 1000
    pass_ms = min(passes) * 1000  # the pass undisturbed, on the threads the scheduler uses
    own_ms = min(own) * 1000  # its part on the scheduler's own thread
    return {
        "rows": rows,
        "vocab": args.vocab,
        "decode_ms": args.decode_ms,
        "sampled": args.sampled,
        "jobs": args.jobs,
        "steps": steps,
        "scheduler_cpu_ms": round(cpu_ms, 3),
        "logits_pass_ms": round(pass_ms, 3),
        "rest_ms": round(cpu_ms - own_ms, 3),
        "wall_over_decode_ms": round(((w1 - w0) - (d1 - d0)) / steps * 1000, 3),
        "tok_s": round(steps * rows / (w1 - w0)),
    }


def per_sampled_row(model: Path, rows: int = 8, draws: int = 30) -> dict:
    """One temperature row's pick, before (`llama_sampler_sample` on the context: llama.cpp
    fills its candidates from the row) and now (`Sampler.sample` on the step's array: numpy
    fills them), the same chain and seed, on a real model's logits (a padded random model
    gives Llama 3's vocabulary)."""
    import llama_cpp

    from contract.jobspec import JobSpec
    from worker.engine import llama_log
    from worker.engine.context import NativeContext, StepBatch
    from worker.engine.sampling import Sampler

    llama_log.install()  # llama.cpp's lines to logging (warnings only), not stderr
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    loaded = llama_cpp.llama_model_load_from_file(str(model).encode(), mparams)
    vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(loaded))
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = 512, 512, rows
    ctx = llama_cpp.llama_init_from_model(loaded, cparams)
    context, batch = NativeContext(ctx, vocab), StepBatch(rows)
    batch.fill([1 + i for i in range(rows)], [0] * rows, list(range(rows)), [True] * rows)
    assert context.decode(batch) == 0
    logits = context.logits(rows)
    spec = JobSpec(id="s", kind="completion", model="m", prompt="x", temperature=0.8, top_p=0.95, seed=1)
    timings: dict[str, list[float]] = {"llama_sampler_sample": [], "Sampler.sample": []}
    for _ in range(draws):
        for index in range(rows):
            for name in timings:
                sampler = Sampler(spec, vocab, 512)
                started = time.perf_counter()
                if name == "Sampler.sample":
                    sampler.sample(logits[index])
                else:
                    llama_cpp.llama_sampler_sample(sampler._chain, ctx, index)
                timings[name].append(time.perf_counter() - started)
                sampler.close()
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(loaded)
    return {"vocab": vocab, **{k: round(statistics.median(v) * 1000, 3) for k, v in timings.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="64,128,256")
    ap.add_argument("--vocab", type=int, default=128_256)
    ap.add_argument("--decode-ms", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--sampled", action="store_true", help="temperature 0.8, top-p 0.95 rows")
    ap.add_argument("--jobs", action="store_true", help="a job thread per sequence, as the worker has")
    ap.add_argument("--tree", type=Path, help="another checkout of the project to measure")
    ap.add_argument("--switch-ms", type=float, help="sys.setswitchinterval, in ms (Python's: 5)")
    ap.add_argument("--model", type=Path, help="only time one temperature row's pick on this GGUF")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.tree is None:
        sys.path.insert(0, str(ROOT))
    if args.model:
        r = per_sampled_row(args.model)
        print(
            json.dumps(r)
            if args.json
            else f"one temperature row of {r['vocab']:,} logits (median ms): "
            f"llama_sampler_sample {r['llama_sampler_sample']:.3f}, Sampler.sample {r['Sampler.sample']:.3f}"
        )
        return
    if args.switch_ms:
        sys.setswitchinterval(args.switch_ms / 1000)
    results = [measure(args, int(r)) for r in args.rows.split(",")]
    if args.json:
        print(json.dumps(results))
        return
    print(
        f"tree {args.tree or ROOT}; vocab {args.vocab}; decode {args.decode_ms} ms; "
        f"{'sampled' if args.sampled else 'greedy'} rows; job threads {'on' if args.jobs else 'off'}"
    )
    print("rows  steps  scheduler CPU ms  logits pass ms  rest ms  wall over decode ms  tok/s")
    for r in results:
        print(
            f"{r['rows']:>4}  {r['steps']:>5}  {r['scheduler_cpu_ms']:>16.3f}  {r['logits_pass_ms']:>14.3f}"
            f"  {r['rest_ms']:>7.3f}  {r['wall_over_decode_ms']:>19.3f}  {r['tok_s']:>5}"
        )


if __name__ == "__main__":
    main()
