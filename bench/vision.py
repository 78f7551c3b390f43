"""Image requests against llama-server `--mmproj` built from the worker's own llama.cpp, on the
same pair of files (issue 77).

    .venv/bin/python bench/vision.py [--requests 16] [--pairs 2] [--image-size 224]

The pair is the default model beside a random CLIP projector (devstack/random_vision.py) of a
small ViT's shape: `--image-size` pixels a side in 16-pixel patches (196 image tokens at 224),
6 layers of width 384. Every request sends an image of its own (random pixels, so nothing is
cached), a short question, greedy, 8 tokens, streamed. Both servers get SLOTS (`-np`) 8 and the
same threads; one runs, then the other, `--pairs` times. Prints, at 1 and 8 requests at once,
requests/s and TTFT p50 of each, and their ratio; then the cost to a running text stream (its
inter-token gap p50 and largest) while 8 image requests arrive beside it, against it alone.
Needs llama-server-worker (scripts/setup_peers) and libmtmd in the wheel (scripts/setup).
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peer_servers import LlamaServer, Server, Tokenspool
from contract.media.images import png
from devstack.random_vision import VisionShape, write_pair

MODEL = "vision"
SLOTS = 8


def stream(base: str, content: list | str, tokens: int, gaps: list[float] | None = None) -> float:
    """One streamed chat answer: its TTFT in s (`gaps`: each inter-token gap appended)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    if gaps is not None:
        body["ignore_eos"] = True
    started = time.perf_counter()
    ttft, last = None, 0.0
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - started
                    elif gaps is not None:
                        gaps.append(now - last)
                    last = now
    return ttft if ttft is not None else time.perf_counter() - started


def image_content(seed: int, size: int) -> list[dict]:
    data = base64.b64encode(png(size, size, seed=seed)).decode()
    return [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
    ]


def burst(base: str, seeds: range, size: int, at_once: int) -> tuple[float, list[float]]:
    """`seeds` image requests, `at_once` at a time: (requests/s, their TTFTs)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(at_once) as pool:
        ttfts = list(pool.map(lambda s: stream(base, image_content(s, size), 8), seeds))
    return len(seeds) / (time.perf_counter() - started), ttfts


def beside(base: str, seeds: range, size: int) -> tuple[list[float], list[float]]:
    """A text stream's gaps alone, then with `seeds` image requests sent while it runs."""
    alone: list[float] = []
    stream(base, "Count from one to a hundred.", 64, alone)
    shared: list[float] = []
    text = threading.Thread(target=stream, args=(base, "Count from one to a hundred.", 96, shared))
    text.start()
    time.sleep(0.5)  # it is decoding
    burst(base, seeds, size, SLOTS - 1)
    text.join()
    return alone, shared


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=16, help="image requests a burst")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-vision-"))
    shape = VisionShape(image_size=args.image_size, hidden=384, ffn=1536, heads=6, layers=6)
    text, mmproj = write_pair(logs / "pair", shape=shape)
    env = {"MODEL_PATH": str(text), "MMPROJ_PATH": str(mmproj), "MODEL_NAME": MODEL}
    servers: list[Server] = [
        Tokenspool(logs, 1, slots=SLOTS, worker_env=env),
        LlamaServer(logs, parallel=SLOTS, same=True, model=text, mmproj=mmproj),
    ]
    for server in servers:
        server.model = MODEL
    print(f"image {args.image_size}x{args.image_size}: {shape.patches} tokens; logs in {logs}")
    figures: dict[str, dict[str, list[float]]] = {s.name: {} for s in servers}
    seed = 0
    for _ in range(args.pairs):
        for server in servers:
            server.start()
            try:
                stream(server.base, image_content(10**6, args.image_size), 2)  # warm
                for at_once in (1, SLOTS):
                    rate, ttfts = burst(
                        server.base, range(seed, seed + args.requests), args.image_size, at_once
                    )
                    seed += args.requests
                    figures[server.name].setdefault(f"{at_once} rate", []).append(rate)
                    figures[server.name].setdefault(f"{at_once} ttft", []).append(statistics.median(ttfts))
                alone, shared = beside(server.base, range(seed, seed + SLOTS - 1), args.image_size)
                seed += SLOTS
                figures[server.name].setdefault("alone", []).extend(alone)
                figures[server.name].setdefault("shared", []).extend(shared)
            finally:
                server.stop()
    ours, peer = (figures[s.name] for s in servers)
    for at_once in (1, SLOTS):
        what = f"{at_once} at once ({args.requests} requests a burst, medians of {args.pairs} runs)"
        print(f"\n{what}:")
        for server in servers:
            f = figures[server.name]
            rate, ttft = statistics.median(f[f"{at_once} rate"]), statistics.median(f[f"{at_once} ttft"])
            print(f"  {server.name:<48} {rate:6.2f} requests/s   TTFT p50 {ttft * 1000:7.0f} ms")
        ratio = statistics.median(ours[f"{at_once} rate"]) / statistics.median(peer[f"{at_once} rate"])
        print(f"  requests/s ratio tokenspool / llama-server: {ratio:.2f}")
    print("\na text stream's inter-token gap, alone / with image requests beside it (p50, largest):")
    for server in servers:
        f = figures[server.name]
        print(
            f"  {server.name:<48} {statistics.median(f['alone']) * 1000:5.0f} / "
            f"{statistics.median(f['shared']) * 1000:5.0f} ms   largest {max(f['alone']) * 1000:5.0f} / "
            f"{max(f['shared']) * 1000:5.0f} ms"
        )


if __name__ == "__main__":
    main()
