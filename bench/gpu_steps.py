"""The GPU benchmark's steps: tokenspool against llama-server built from the same llama.cpp,
same model, slots and context, both generating exactly `max_tokens` (`ignore_eos`), in
paired, alternated runs with a bootstrap interval (bench/paired.py's method).

    python -m bench.gpu_steps --out DIR --llama DIR --tokenizer GGUF [--rehearse] [--budget-s S]

bench/gpu_run runs this inside the venv it makes from the bundle; `--llama` holds the
bundle's llama.cpp (its libraries, which the worker loads through LLAMA_CPP_LIB_PATH, and
llama-server). The steps, in order of priority, each written to DIR/gpu.json the moment a
level ends (a run cut short still leaves its figures), then DIR/gpu.md and DIR/gpu.png:

1. 8B shape (devstack/random_model.py, SmolLM2's 49,152-token vocabulary), every layer
   offloaded, SLOTS=64, at 64 then 32 streams: the 2026-11-27 run's comparison;
2. the 8B shape with Llama 3's vocabulary (128,256 tokens, padded), SLOTS=256 and 512
   tokens a slot, at 64, 128, 256, then 32, 8 and 1 streams, on one pair of servers;
3. a GPU worker SIGKILLed mid-stream while a second is up: every stream ends whole, its text
   exactly what the job published, its tokens exactly max_tokens;
4. the 1B shape at 64 and 32 streams;
5. issue 27's comparison on cores of their own, CPU-only (the GPU hidden from both servers:
   a CUDA build otherwise sends a large step's matrix products to it): SmolLM2's shape,
   the worker and llama-server pinned to the same 4 cores, the API, Redis and the client on
   the others, at 8, 16 and 32 streams, shorter (2 pairs of 64 tokens);
6. the worker's own work per step on this host's CPU (bench/step_overhead.py).

What is dropped when time runs out: a level starts only if the time left covers it, judged
by the step's last level scaled by its streams (at least a minute); the steps after run in
what is left, so the last steps go first. Each tokenspool run carries the worker's profile
(its counters' change over the run, /metrics): decode, the wait for the GPU and picking per
step, the job threads' Python per token, the publisher's round trips. `--rehearse` runs the
same sequence on a CPU-only machine with the tiny shape, few streams and short answers, in a
few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.lib import charts
from bench.lib.gpu_servers import PROFILE, Launch, LlamaServer, Tokenspool, described
from bench.paired import interval
from bench.peers import SHORT, workload
from devstack import random_model

FIGURES = ("tok_s_total", "ttft_p50", "itl_p50")
LLAMA3_VOCAB = 128_256


@dataclass(frozen=True)
class Plan:
    """What the run does: the GPU's, or the rehearsal's (smaller) on a CPU."""

    big: str  # the model shape of steps 1 to 3
    small: str  # step 4's
    kind: str  # its weights' type
    many: tuple[int, ...]  # step 1's and 4's streams
    wide: tuple[int, ...]  # step 2's, in order of priority
    cpu_streams: tuple[int, ...]  # step 5's
    pairs: int
    wide_pairs: int  # step 2's pairs above 64 streams
    max_tokens: int
    cpu_pairs: int
    cpu_max_tokens: int
    gpu_layers: int
    slots: int
    wide_slots: int
    n_ctx: int
    wide_n_ctx: int  # step 2's tokens a slot: 256 slots of both servers fit one GPU
    engine_cpus: str  # step 5: the worker's and llama-server's cores
    service_cpus: str  # step 5: the API's, Redis's and the client's
    threads: int  # step 5: llama.cpp threads of both
    step_delay_s: float  # step 3: a pause per decode step, so the kill lands mid-stream on a CPU


def plan(rehearse: bool) -> Plan:
    cores = os.cpu_count() or 2
    if rehearse:
        return Plan(
            big="tiny", small="tiny", kind="q8_0", many=(8, 1), wide=(8, 16, 1), cpu_streams=(1, 8),
            pairs=2, wide_pairs=1, max_tokens=32, cpu_pairs=1, cpu_max_tokens=16, gpu_layers=0,
            slots=8, wide_slots=16, n_ctx=512, wide_n_ctx=256, engine_cpus="0",
            service_cpus=f"1-{cores - 1}", threads=1, step_delay_s=0.01,
        )  # fmt: skip
    return Plan(
        big="8b", small="1b", kind="q4_0", many=(64, 32), wide=(64, 128, 256, 32, 8, 1),
        cpu_streams=(8, 16, 32), pairs=3, wide_pairs=2, max_tokens=256, cpu_pairs=2,
        cpu_max_tokens=64, gpu_layers=-1, slots=64, wide_slots=256, n_ctx=1024, wide_n_ctx=512,
        engine_cpus="0-3", service_cpus=f"4-{cores - 1}", threads=4, step_delay_s=0.0,
    )  # fmt: skip


@dataclass
class Run:
    out: Path
    llama: Path
    tokenizer: Path
    plan: Plan
    deadline: float
    logs: Path
    models: Path
    data: dict = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self, section: str, entry: dict) -> None:
        """The step's figures, at once (bench/lib/charts.py's format, and the details)."""
        charts.record(self.out / "gpu.json", section, entry)
        print(f"[{time.strftime('%H:%M:%S')}] {section}: saved", flush=True)

    def model(self, shape: str, kind: str, vocab: int | None = None) -> Path:
        path = self.models / f"{shape}-{kind}{f'-v{vocab}' if vocab else ''}.gguf"
        if not path.exists():
            started = time.monotonic()
            random_model.write(shape, path, kind, tokenizer=self.tokenizer, vocab=vocab)
            took = time.monotonic() - started
            print(f"wrote {path.name} ({path.stat().st_size / 2**30:.1f} GiB) in {took:.0f} s", flush=True)
        return path


async def paired(a: Tokenspool, b: LlamaServer, streams: int, pairs: int, max_tokens: int) -> dict:
    """`pairs` back-to-back runs of both (ABBA), the ratios a / b with their intervals, the
    medians, and tokenspool's profile over its runs."""
    extra = {"ignore_eos": True}
    await workload(a, streams, SHORT, 8, extra=extra)  # warm: each concurrency's first steps
    await workload(b, streams, SHORT, 8, extra=extra)
    got: list[tuple[dict, dict]] = []
    before = a.counters()
    for i in range(pairs):
        run = {}
        for s in (a, b) if i % 2 == 0 else (b, a):
            run[s] = await workload(s, streams, SHORT, max_tokens, extra=extra)
        got.append((run[a], run[b]))
    after = a.counters()
    ratios = {}
    for key in FIGURES:
        r = [ra[key] / rb[key] for ra, rb in got if rb[key] and ra[key] == ra[key]]
        if r:
            lo, hi = interval(r)
            ratios[key] = {"median": statistics.median(r), "low": lo, "high": hi}
    return {
        "streams": streams,
        "pairs": [{"tokenspool": ra, "llama-server": rb} for ra, rb in got],
        "ratios": ratios,
        "medians": [_median(s.name, streams, [g[i] for g in got]) for i, s in enumerate((a, b))],
        "profile": profile({k: after[k] - before[k] for k in PROFILE}),
    }


def _median(server: str, streams: int, runs: list[dict]) -> dict:
    keys_ = [k for k, v in runs[0].items() if isinstance(v, float)]
    out = {k: statistics.median(r[k] for r in runs) for k in keys_}
    return {
        "server": server,
        "streams": streams,
        **out,
        "ok": sum(r["ok"] for r in runs),
        "of": streams * len(runs),
    }


def profile(d: dict[str, float]) -> dict[str, float]:
    """Where a tokenspool step's time went, from its counters' change over the runs."""
    steps, tokens, rounds = max(d["steps"], 1), max(d["tokens"], 1), max(d["publishes"], 1)
    return {
        "decode_ms_per_step": d["decode_us"] / steps / 1000,
        "wait_ms_per_step": d.get("wait_us", 0.0) / steps / 1000,
        "sample_ms_per_step": d["sample_us"] / steps / 1000,
        "python_us_per_token": d["token_us"] / tokens,
        "publish_ms_per_round_trip": d["publish_us"] / rounds / 1000,
        "rows_per_step": d["sequences"] / steps,
        "tokens_per_round_trip": d["tokens"] / rounds,
    }


async def compare(
    run: Run,
    section: str,
    title: str,
    launch: Launch,
    levels: tuple[int, ...],
    pairs: Callable[[int], int],
    max_tokens: int,
) -> None:
    """Tokenspool and llama-server up together, each concurrency paired (`pairs(streams)`
    pairs); saved as one section, level by level. A level starts only if the time left
    covers it: the last level's time scaled by its streams, at least a minute."""
    a, b = Tokenspool(run.logs, launch), LlamaServer(run.logs, launch, run.llama / "llama-server")
    entry = {"title": title, "launch": described(launch), "results": [], "levels": []}
    try:
        a.start()
        b.start()
        last: tuple[int, float] | None = None
        for streams in levels:
            if run.left() < (need := needed(last, streams)):
                entry.setdefault("skipped", []).append(
                    f"{streams} streams: {run.left():.0f} s left of the ~{need:.0f} s it needs"
                )
                continue
            started = time.monotonic()
            level = await paired(a, b, streams, pairs(streams), max_tokens)
            last = (streams, time.monotonic() - started)
            level["seconds"] = round(last[1], 1)
            entry["levels"].append(level)
            entry.setdefault("notes", []).append(_ratios(level))
            entry["results"] += level["medians"]
            run.save(section, entry)
    finally:
        for s in (a, b):
            s.stop()
    run.save(section, entry)


def needed(last: tuple[int, float] | None, streams: int) -> float:
    """The seconds a level of `streams` is expected to take: the step's last level
    (`(streams, seconds)`) scaled by its streams, and no less than a minute (a first level:
    a minute)."""
    if last is None:
        return 60.0
    return max(60.0, last[1] * streams / last[0])


def _ratios(level: dict) -> str:
    """One concurrency's paired ratios and tokenspool's profile, as a line of the report."""
    names = {"tok_s_total": "tok/s", "ttft_p50": "TTFT p50", "itl_p50": "ITL p50"}
    parts = [
        f"{names[k]} {r['median']:.3f} ({r['low']:.3f}-{r['high']:.3f})" for k, r in level["ratios"].items()
    ]
    f = level["profile"]
    return (
        f"{level['streams']} streams, tokenspool / llama-server (95 % interval): {', '.join(parts)}. "
        f"tokenspool's step: decode {f['decode_ms_per_step']:.2f} ms, "
        f"waiting for its logits {f['wait_ms_per_step']:.2f} ms, "
        f"picking {f['sample_ms_per_step']:.2f} ms, {f['rows_per_step']:.1f} rows; "
        f"job threads {f['python_us_per_token']:.0f} µs a token; publisher "
        f"{f['publish_ms_per_round_trip']:.2f} ms a round trip of {f['tokens_per_round_trip']:.1f} tokens."
    )


async def crash(run: Run, launch: Launch) -> None:
    """Two workers; the one holding the most streams is SIGKILLed mid-stream; every stream
    must end whole: finish and [DONE], max_tokens tokens, and its text the job's own."""
    streams = 16 if run.plan.gpu_layers else 4
    tokens = launch.n_ctx - 128  # long enough that every stream is mid-answer at the kill
    delay = run.plan.step_delay_s
    pool = Tokenspool(run.logs, dataclasses.replace(launch, slots=streams, step_delay_s=delay), workers=2)
    entry: dict = {
        "title": "a GPU worker SIGKILLed mid-stream, a second one up",
        "launch": described(launch),
        "tokens": tokens,
        "step_delay_s": delay,
    }
    try:
        pool.start()
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10)) as client:
            tasks = [asyncio.create_task(_whole(client, pool, tokens)) for _ in range(streams)]
            entry["killed"] = await asyncio.to_thread(pool.kill_holder, streams)
            got = await asyncio.gather(*tasks)
            for g in got:
                g["replayed"] = await _replay(client, pool, g["id"])
        entry["streams"] = streams
        entry["whole"] = sum(g["ok"] and g["tokens"] == tokens and g["text"] == g["replayed"] for g in got)
        entry["details"] = [{k: v for k, v in g.items() if k not in ("text", "replayed")} for g in got]
        entry["notes"] = [
            f"{entry['whole']} of {streams} streams of {tokens} tokens ended whole (finish, [DONE], "
            f"every token, the text the job published) after {entry['killed']} was SIGKILLed."
        ]
    finally:
        pool.stop()
    run.save("crash", entry)


async def _whole(client: httpx.AsyncClient, server: Tokenspool, max_tokens: int) -> dict:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {SHORT}"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out = {"id": "", "text": "", "tokens": 0, "ok": False, "error": None}
    done = False
    async with client.stream("POST", server.base + "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                chunk = json.loads(line[6:])
                out["error"] = out["error"] or chunk.get("error")
                out["id"] = out["id"] or chunk.get("id", "")
                for c in chunk.get("choices") or []:
                    out["text"] += (c.get("delta") or {}).get("content") or ""
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
    out["ok"] = done and not out["error"]
    return out


async def _replay(client: httpx.AsyncClient, server: Tokenspool, job_id: str) -> str:
    """The job's text as the server recorded it (GET ...?stream=true from the start)."""
    text = ""
    async with client.stream("GET", f"{server.base}/v1/chat/completions/{job_id}?stream=true") as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:]).get("choices") or []:
                    text += (c.get("delta") or {}).get("content") or ""
    return text


STEPS = ("many", "wide", "crash", "small", "cpu", "overhead")  # in order of priority


async def steps(run: Run, chosen: tuple[str, ...] = STEPS) -> None:
    """The steps named in `chosen`, in their order (a later call may run what an earlier one
    had no time for)."""
    p = run.plan
    gpu = {"slots": p.slots, "n_ctx": p.n_ctx, "gpu_layers": p.gpu_layers}
    pairs = lambda streams: p.pairs  # noqa: E731
    big = Launch(run.model(p.big, p.kind), f"random-{p.big}", **gpu)
    for name in chosen:
        if name == "many":
            title = f"{p.big} shape, every layer offloaded"
            await compare(run, f"{p.big}-many", title, big, p.many, pairs, p.max_tokens)
        elif name == "wide" and run.left() > 60:
            wide = Launch(
                run.model(p.big, p.kind, LLAMA3_VOCAB),
                f"random-{p.big}-l3",
                slots=p.wide_slots,
                n_ctx=p.wide_n_ctx,
                gpu_layers=p.gpu_layers,
            )
            title = f"{p.big} shape with Llama 3's vocabulary ({LLAMA3_VOCAB:,}), every layer offloaded"
            wide_pairs = lambda streams: p.pairs if streams <= 64 else p.wide_pairs  # noqa: E731
            await compare(run, f"{p.big}-l3", title, wide, p.wide, wide_pairs, p.max_tokens)
        elif name == "crash" and run.left() > 60:
            await crash(run, big)
        elif name == "small" and run.left() > 90:
            small = Launch(run.model(p.small, p.kind), f"random-{p.small}", **gpu)
            title = f"{p.small} shape, every layer offloaded"
            await compare(run, f"{p.small}-many", title, small, p.many, pairs, p.max_tokens)
        elif name == "cpu" and run.left() > 90:
            await cpu_cores(run)
        elif name == "overhead" and run.left() > 30:
            await overhead(run)


async def cpu_cores(run: Run) -> None:
    """Issue 27's comparison on cores of their own, the GPU hidden from both servers."""
    p = run.plan
    os.sched_setaffinity(0, _cores(p.service_cpus))  # the client on the services' cores
    cpu = Launch(
        run.model("smollm2", "q4_1"),
        "random-smollm2",
        slots=max(p.cpu_streams),
        n_ctx=p.n_ctx,
        gpu_layers=0,
        threads=p.threads,
        cpus=p.engine_cpus,
        service_cpus=p.service_cpus,
        cpu_only=True,
    )
    title = f"SmolLM2's shape on {p.threads} cores of their own, the GPU hidden from both"
    cpu_pairs = lambda streams: p.cpu_pairs  # noqa: E731
    try:
        await compare(run, "cpu-cores", title, cpu, p.cpu_streams, cpu_pairs, p.cpu_max_tokens)
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


async def overhead(run: Run) -> None:
    """The worker's own work per step on this host's CPU (bench/step_overhead.py: the real
    scheduler, a stand-in GPU of 6 ms a step, a job thread per sequence), for both vocabularies."""
    entry: dict = {"title": "the worker's own work per step, a stand-in GPU (bench/step_overhead.py)"}
    for vocab in (random_model.VOCAB, LLAMA3_VOCAB):
        argv = ["-m", "bench.step_overhead", "--json", "--jobs", "--vocab", str(vocab), "--steps", "60"]
        argv += ["--rows", "8,16" if run.plan.gpu_layers == 0 else "64,128,256"]
        done = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await done.communicate()
        try:
            rows = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            entry.setdefault("errors", []).append(out.decode()[-2000:])
            continue
        entry.setdefault("overhead", []).extend(rows)
        for r in rows:
            entry.setdefault("notes", []).append(
                f"{r['rows']} rows of {r['vocab']:,} logits: scheduler CPU {r['scheduler_cpu_ms']:.2f} ms a "
                f"step (the logits pass {r['logits_pass_ms']:.2f} ms, the rest {r['rest_ms']:.2f} ms); "
                f"wall over the stand-in's decode {r['wall_over_decode_ms']:.2f} ms."
            )
    run.save("overhead", entry)


def _cores(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--llama", type=Path, required=True, help="the bundle's llama.cpp: libraries and llama-server"
    )
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--models", type=Path, default=Path("/tmp/tokenspool-gpu-models"))
    ap.add_argument("--rehearse", action="store_true")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting steps after this")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"which, in this order (of {','.join(STEPS)})")
    ap.add_argument("--wide", help="step 2's levels, e.g. 256 (the plan's by default)")
    ap.add_argument("--wide-pairs", type=int, help="step 2's pairs above 64 streams")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.models.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ.get("GPU_RUN_LOGS") or tempfile.mkdtemp(prefix="gpu-logs-"))
    chosen = plan(args.rehearse)
    if args.wide:
        chosen = dataclasses.replace(chosen, wide=tuple(int(n) for n in args.wide.split(",")))
    if args.wide_pairs:
        chosen = dataclasses.replace(chosen, wide_pairs=args.wide_pairs)
    run = Run(
        args.out,
        args.llama,
        args.tokenizer,
        chosen,
        time.monotonic() + args.budget_s,
        logs,
        args.models,
    )
    try:
        asyncio.run(steps(run, tuple(args.steps.split(","))))
    finally:
        data = json.loads((args.out / "gpu.json").read_text()) if (args.out / "gpu.json").exists() else {}
        (args.out / "gpu.md").write_text("\n".join(charts.markdown(data)) + "\n")


if __name__ == "__main__":
    main()
