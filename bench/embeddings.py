"""Embedding throughput: tokenspool's embedding pool against llama-server `--embedding`, on the
same GGUF with the same pooling, threads and batch, in paired, alternated rounds.

    .venv/bin/python bench/embeddings.py [--clients 64] [--inputs 8] [--requests 2] [--pairs 3]
                                         [--batch 2048] [--threads 2] [--out bench/results/RESULTS.md]

Each round, `--clients` concurrent clients each send `--requests` requests of `--inputs`
short distinct texts, one after another; a round's figure is the inputs embedded over its wall
time (every request answered: a closed workload, the same for both servers). tokenspool runs
valkey, one API and one worker with POOLING=mean, SLOTS=`--clients`, EMBEDDING_BATCH_TOKENS=
`--batch`; llama-server (built from the llama.cpp inside the worker's own llama-cpp-python:
scripts/setup_peers) runs `--embedding --pooling mean -kvu -np <clients> -b/-ub <batch> -c <batch>`,
both with `--threads` threads. Pairs run in ABBA order (a steady drift favours neither); the
summary is the median ratio of inputs/s with its 95 % bootstrap interval, printed and written
as its own section of `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peers_report import machine, write_section
from bench.paired import interval
from devstack.processes import (
    Proc,
    _spawn,
    _wait,
    free_port,
    start_api,
    start_redis,
    start_worker,
    wait_for_model,
)
from worker.settings import DEFAULT_MODEL_NAME, default_model_path

ANIMALS = ("cat", "dog", "heron", "otter", "fox", "owl", "seal", "crab")
FOODS = ("fish", "bread", "apples", "seeds", "clams", "honey", "rice", "plums")


def texts(round_no: int, client: int, request: int, n: int) -> list[str]:
    """Short, distinct inputs (about ten tokens each)."""
    return [
        f"Note {round_no}.{client}.{request}.{i}: the {ANIMALS[(client + i) % 8]} likes "
        f"{FOODS[(request + i) % 8]}."
        for i in range(n)
    ]


class Tokenspool:
    name = "tokenspool (one embedding worker)"

    def __init__(self, logs: Path, args: argparse.Namespace) -> None:
        self.procs: list[Proc] = []
        redis_proc, url = start_redis(logs)
        api, self.base = start_api(logs, url, env={"LOG_LEVEL": "WARNING", "MAX_QUEUE_DEPTH": "0"})
        env = {
            "POOLING": "mean",
            "SLOTS": str(args.clients),
            "EMBEDDING_BATCH_TOKENS": str(args.batch),
            "N_CTX": "512",
            "N_THREADS": str(args.threads),
            "N_THREADS_BATCH": str(args.threads),
            "LOG_LEVEL": "WARNING",
        }
        worker = start_worker(logs, url, name="e1", env=env)
        self.procs = [redis_proc, api, worker]
        wait_for_model(self.base, DEFAULT_MODEL_NAME, procs=tuple(self.procs), embeddings=True)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


class LlamaServer:
    name = "llama-server --embedding (the worker's llama.cpp)"

    def __init__(self, logs: Path, args: argparse.Namespace) -> None:
        binary = Path(sys.executable).parent / "llama-server-worker"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run scripts/setup_peers")
        port = free_port()
        argv = [str(binary), "-m", str(default_model_path()), "--alias", DEFAULT_MODEL_NAME]
        argv += ["--embedding", "--pooling", "mean", "-kvu", "-np", str(args.clients)]
        argv += ["-b", str(args.batch), "-ub", str(args.batch), "-c", str(args.batch)]
        argv += [
            "-t",
            str(args.threads),
            "-tb",
            str(args.threads),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        self.procs = [_spawn(f"llama-server-{port}", argv, logs, {"LD_LIBRARY_PATH": str(binary.parent)})]
        self.base = f"http://127.0.0.1:{port}"
        _wait(self._up, 120, *self.procs)

    def _up(self) -> bool:
        try:
            return httpx.get(self.base + "/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


async def run_round(base: str, args: argparse.Namespace, round_no: int) -> dict:
    """Every client's requests, one after another; inputs/s over the round's wall time."""
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=base + "/v1", timeout=600, limits=limits) as http:

        async def client(c: int) -> int:
            done = 0
            for r in range(args.requests):
                body = {"model": DEFAULT_MODEL_NAME, "input": texts(round_no, c, r, args.inputs)}
                resp = await http.post("/embeddings", json=body)
                resp.raise_for_status()
                data = resp.json()["data"]
                assert [d["index"] for d in data] == list(range(args.inputs))
                done += len(data)
            return done

        started = time.perf_counter()
        inputs = sum(await asyncio.gather(*(client(c) for c in range(args.clients))))
        wall = time.perf_counter() - started
    return {"inputs": inputs, "seconds": wall, "inputs_s": inputs / wall}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    servers = {"a": Tokenspool(logs, args), "b": LlamaServer(logs, args)}
    rounds = itertools.count()
    try:
        for s in servers.values():  # a warm-up round each (pages mapped, threads started)
            await run_round(s.base, argparse.Namespace(**{**vars(args), "requests": 1}), next(rounds))
        pairs: list[tuple[dict, dict]] = []
        for i in range(args.pairs):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            got = {k: await run_round(servers[k].base, args, next(rounds)) for k in order}
            pairs.append((got["a"], got["b"]))
            a, b = got["a"]["inputs_s"], got["b"]["inputs_s"]
            print(
                f"pair {i + 1}: tokenspool {a:.1f} inputs/s, llama-server {b:.1f}, ratio {a / b:.3f}",
                flush=True,
            )
    finally:
        for s in servers.values():
            s.stop()
    ratios = [a["inputs_s"] / b["inputs_s"] for a, b in pairs]
    lo, hi = interval(ratios)
    cmd = "bench/embeddings.py " + " ".join(sys.argv[1:])
    lines = [
        "## Embeddings: one embedding worker against llama-server --embedding (bench/embeddings.py)",
        "",
        f"`{cmd}` on {machine()}, {time.strftime('%Y-%m-%d')}: {args.clients} clients, each "
        f"{args.requests} requests of {args.inputs} inputs per round, {args.pairs} pairs (ABBA).",
        "",
        "| server | inputs/s (median) |",
        "|---|---|",
        f"| {servers['a'].name} | {statistics.median(a['inputs_s'] for a, _ in pairs):.1f} |",
        f"| {servers['b'].name} | {statistics.median(b['inputs_s'] for _, b in pairs):.1f} |",
        "",
        f"Ratio tokenspool / llama-server: median {statistics.median(ratios):.3f}, 95 % interval "
        f"{lo:.3f} to {hi:.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)}).",
    ]
    print("\n".join(lines))
    if args.out:
        write_section(args.out, "Embeddings against llama-server", lines)


if __name__ == "__main__":
    asyncio.run(main())
