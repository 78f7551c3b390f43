"""Embedding and rerank throughput: tokenspool's embedding (or rerank) pool against llama-server
`--embedding` (or `--rerank`), on the same GGUF with the same pooling, threads and batch, in
paired, alternated rounds.

    .venv/bin/python bench/endpoints/embeddings.py [--clients 64] [--inputs 8] [--requests 2] [--pairs 3]
                                         [--batch 2048] [--threads 2] [--rerank]
                                         [--out bench/results/RESULTS.md]

With `--rerank` both serve the random BERT cross-encoder `devstack.random_model --rerank`
writes (no reranker GGUF is on the package registries), each request is one query and
`--inputs` documents, and the figure is pairs scored per second.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.peers_report import machine, write_section
from bench.paired import interval
from devstack import random_model
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


RERANKER = "tiny-reranker"
QUERY = "Which animal eats fish?"


def model_file(logs: Path, args: argparse.Namespace) -> tuple[Path, str]:
    """The GGUF both servers load and the name it is served under."""
    if not args.rerank:
        return default_model_path(), DEFAULT_MODEL_NAME
    path = logs / "tiny-reranker.gguf"
    if not path.exists():
        random_model.write_reranker(path)
    return path, RERANKER


class Tokenspool:
    def __init__(self, logs: Path, args: argparse.Namespace) -> None:
        self.name = f"tokenspool (one {'rerank' if args.rerank else 'embedding'} worker)"
        self.procs: list[Proc] = []
        redis_proc, url = start_redis(logs)
        api, self.base = start_api(logs, url, env={"LOG_LEVEL": "WARNING", "MAX_QUEUE_DEPTH": "0"})
        path, model = model_file(logs, args)
        pooling = {"MODEL_PATH": str(path), "MODEL_NAME": model} if args.rerank else {"POOLING": "mean"}
        env = {
            **pooling,
            "SLOTS": str(args.clients),
            "EMBEDDING_BATCH_TOKENS": str(args.batch),
            "N_CTX": "512",
            "N_THREADS": str(args.threads),
            "N_THREADS_BATCH": str(args.threads),
            "LOG_LEVEL": "WARNING",
        }
        worker = start_worker(logs, url, name="e1", env=env)
        self.procs = [redis_proc, api, worker]
        if args.rerank:
            _wait(lambda: self._rankers(model) > 0, 120, *self.procs)
        else:
            wait_for_model(self.base, model, procs=tuple(self.procs), embeddings=True)

    def _rankers(self, model: str) -> int:
        data = httpx.get(self.base + "/v1/models", timeout=5).json()["data"]
        return next((m.get("rerank_workers", 0) for m in data if m["id"] == model), 0)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()


class LlamaServer:
    def __init__(self, logs: Path, args: argparse.Namespace) -> None:
        flag = "--rerank" if args.rerank else "--embedding"
        self.name = f"llama-server {flag} (the worker's llama.cpp)"
        binary = Path(sys.executable).parent / "llama-server-worker"
        if not binary.exists():
            raise SystemExit(f"{binary} is missing: run scripts/setup_peers")
        port = free_port()
        path, model = model_file(logs, args)
        argv = [str(binary), "-m", str(path), "--alias", model]
        argv += ["--rerank"] if args.rerank else ["--embedding", "--pooling", "mean"]
        argv += ["-kvu", "-np", str(args.clients)]
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
                done += await ask(http, texts(round_no, c, r, args.inputs), args.rerank)
            return done

        started = time.perf_counter()
        inputs = sum(await asyncio.gather(*(client(c) for c in range(args.clients))))
        wall = time.perf_counter() - started
    return {"inputs": inputs, "seconds": wall, "inputs_s": inputs / wall}


async def ask(http: httpx.AsyncClient, inputs: list[str], rerank: bool) -> int:
    """One request; the inputs embedded (or pairs scored), each checked to be there."""
    if rerank:
        body = {"model": RERANKER, "query": QUERY, "documents": inputs}
        resp = await http.post("/rerank", json=body)
        resp.raise_for_status()
        indices = sorted(d["index"] for d in resp.json()["results"])
    else:
        resp = await http.post("/embeddings", json={"model": DEFAULT_MODEL_NAME, "input": inputs})
        resp.raise_for_status()
        indices = [d["index"] for d in resp.json()["data"]]
    assert indices == list(range(len(inputs)))
    return len(inputs)


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
    parser.add_argument("--rerank", action="store_true", help="rerank pairs instead of embeddings")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    unit = "pairs/s" if args.rerank else "inputs/s"
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
                f"pair {i + 1}: tokenspool {a:.1f} {unit}, llama-server {b:.1f}, ratio {a / b:.3f}",
                flush=True,
            )
    finally:
        for s in servers.values():
            s.stop()
    ratios = [a["inputs_s"] / b["inputs_s"] for a, b in pairs]
    title = "Rerank" if args.rerank else "Embeddings"
    lo, hi = interval(ratios)
    cmd = "bench/endpoints/embeddings.py " + " ".join(sys.argv[1:])
    lines = [
        f"## {title}: {servers['a'].name} against {servers['b'].name} (bench/endpoints/embeddings.py)",
        "",
        f"`{cmd}` on {machine()}, {time.strftime('%Y-%m-%d')}: {args.clients} clients, each "
        f"{args.requests} requests of {args.inputs} inputs per round, {args.pairs} pairs (ABBA).",
        "",
        f"| server | {unit} (median) |",
        "|---|---|",
        f"| {servers['a'].name} | {statistics.median(a['inputs_s'] for a, _ in pairs):.1f} |",
        f"| {servers['b'].name} | {statistics.median(b['inputs_s'] for _, b in pairs):.1f} |",
        "",
        f"Ratio tokenspool / llama-server ({args.clients} clients): median "
        f"{statistics.median(ratios):.3f}, 95 % interval "
        f"{lo:.3f} to {hi:.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)}).",
    ]
    print("\n".join(lines))
    if args.out:
        section = f"{title} against llama-server, {args.clients} clients" if args.rerank else None
        write_section(args.out, section or "Embeddings against llama-server", lines)


if __name__ == "__main__":
    asyncio.run(main())
