"""The two servers bench/gpu_steps.py compares, as it starts, reads and stops them: tokenspool
(Redis, the API, its workers, from devstack) and llama-server from the bundle's llama.cpp,
each given one model the same way (`Launch`)."""

from __future__ import annotations

import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.lib.peer_servers import Server
from contract import keys
from devstack.peek import running_ids
from devstack.processes import Proc, _spawn, _wait, free_port, start_api, start_redis, start_worker

PROFILE = (  # the worker counters a tokenspool run reports (bench/gpu_steps.py divides them)
    "steps",
    "sequences",
    "decode_us",
    "wait_us",
    "sample_us",
    "token_us",
    "tokens",
    "publish_us",
    "publishes",
)


@dataclass(frozen=True)
class Launch:
    """A model as both servers are given it."""

    path: Path
    name: str
    slots: int
    n_ctx: int
    gpu_layers: int
    threads: int | None = None
    cpus: str | None = None  # the engine's cores (None: any)
    service_cpus: str | None = None  # tokenspool's API and Redis (None: any)
    step_delay_s: float = 0.0  # the worker's STEP_DELAY_SECONDS (step 3's rehearsal)
    cpu_only: bool = False  # the GPU hidden from both servers (CUDA_VISIBLE_DEVICES="")


class Tokenspool(Server):
    def __init__(self, logs: Path, launch: Launch, workers: int = 1) -> None:
        super().__init__(logs)
        self.launch, self.workers = launch, workers
        self.model = launch.name
        self.name = f"tokenspool ({workers} worker{'s' * (workers > 1)}, SLOTS={launch.slots})"

    def start(self) -> None:
        service = self.launch.service_cpus
        redis_proc, self.url = start_redis(self.logs, cpus=service)
        api, self.base = start_api(self.logs, self.url, env={"LOG_LEVEL": "WARNING"}, cpus=service)
        self.procs = [redis_proc, api]
        for i in range(self.workers):
            self.procs.append(self._worker(f"w{i}-{uuid.uuid4().hex[:4]}"))
        _wait(self._served, 900, *self.procs)

    def _worker(self, name: str) -> Proc:
        l = self.launch  # noqa: E741
        env = {
            "MODEL_PATH": str(l.path),
            "MODEL_NAME": l.name,
            "SLOTS": str(l.slots),
            "N_CTX": str(l.n_ctx),
            "N_GPU_LAYERS": str(l.gpu_layers),
            "WARM_UP_SECONDS": "10",
            "LOG_LEVEL": "INFO",
        }
        if l.step_delay_s:
            env["STEP_DELAY_SECONDS"] = str(l.step_delay_s)
        if l.threads:
            env |= {"N_THREADS": str(l.threads), "N_THREADS_BATCH": str(l.threads)}
        if l.cpu_only:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return start_worker(self.logs, self.url, name=name, env=env, cpus=l.cpus)

    def _served(self) -> bool:
        try:
            data = httpx.get(self.base + "/v1/models", timeout=2).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return any(m["id"] == self.model and m["workers"] >= self.workers for m in data)

    def counters(self) -> dict[str, float]:
        """The workers' profile counters (tokenspool_batch_*_total) for the model."""
        out = dict.fromkeys(PROFILE, 0.0)
        for line in httpx.get(self.base + "/metrics", timeout=10).text.splitlines():
            m = re.match(r'tokenspool_batch_(\w+)_total\{model="([^"]*)"\} (\S+)', line)
            if m and m[2] == self.model and m[1] in out:
                out[m[1]] = float(m[3])
        return out

    def kill_holder(self, streams: int, within_s: float = 120.0) -> str:
        """A second after all `streams` jobs run, SIGKILL the worker holding the most; its name."""
        import redis as sync_redis

        r = sync_redis.Redis.from_url(self.url)
        held: dict[str, int] = {}
        deadline = time.monotonic() + within_s
        while sum(held.values()) < streams and time.monotonic() < deadline:
            time.sleep(0.05)
            held = {}
            for job_id in running_ids(r):
                worker = r.hget(keys.job(job_id), keys.JobField.WORKER)
                if worker:
                    held[worker.decode()] = held.get(worker.decode(), 0) + 1
        if not held:
            raise RuntimeError(f"no job ran within {within_s:.0f} s")
        time.sleep(1.0)  # every stream some tokens in
        victim = max(held, key=lambda w: held[w])
        next(p for p in self.procs if p.name == victim).signal(signal.SIGKILL)
        return victim


class LlamaServer(Server):
    def __init__(self, logs: Path, launch: Launch, binary: Path) -> None:
        super().__init__(logs)
        self.launch, self.binary = launch, binary
        self.model = launch.name
        self.name = f"llama-server (-np {launch.slots}, the same llama.cpp)"

    def start(self) -> None:
        l = self.launch  # noqa: E741
        port = free_port()
        argv = [str(self.binary), "-m", str(l.path), "--alias", l.name, "-np", str(l.slots)]
        argv += ["-c", str(l.slots * l.n_ctx), "-ngl", str(l.gpu_layers if l.gpu_layers >= 0 else 999)]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--no-webui"]
        if l.threads:
            argv += ["-t", str(l.threads), "-tb", str(l.threads)]
        env = {"LD_LIBRARY_PATH": str(self.binary.parent)}
        if l.cpu_only:
            env["CUDA_VISIBLE_DEVICES"] = ""
        self.procs = [_spawn(f"llama-server-{port}", argv, self.logs, env, cpus=l.cpus)]
        self.base = f"http://127.0.0.1:{port}"
        _wait(self._up, 900, *self.procs)

    def _up(self) -> bool:
        try:
            return httpx.get(self.base + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False


def described(launch: Launch) -> dict:
    return {
        "model": launch.path.name,
        "bytes": launch.path.stat().st_size,
        "slots": launch.slots,
        "n_ctx": launch.n_ctx,
        "gpu_layers": launch.gpu_layers,
        "threads": launch.threads,
        "engine_cpus": launch.cpus,
        "service_cpus": launch.service_cpus,
    }
