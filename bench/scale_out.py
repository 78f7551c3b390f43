"""Scale-out benchmark (issue 5): one API process relaying many streams, synthetic workers.

    .venv/bin/python bench/scale_out.py [--streams 500,1000,2000] [--workers 4] [--cluster N]

Runs, in one session against one embedded valkey, each figure for tokenspool's relay (one
reader connection for all streams, api/streaming/reader.py) next to the same figure for a
one-connection-per-stream relay (bench/lib/per_stream_relay.py: the same app, each stream
blocking in its own XREAD) and, for throughput, a bare Starlette endpoint streaming the same
events from memory (bench/lib/bare_sse.py), all driven by the same load generator (bench/lib/loadgen.py):

1. held open: N streams opened at once while no worker runs (they wait in the queue, with
   keep-alives), the API's RSS measured, then workers started; every stream must end with
   the exact synthetic text, finish_reason "stop" and [DONE] (devstack/sse_contract.py).
2. throughput: concurrent streams of many tokens from workers emitting as fast as they can;
   aggregate content events per second, as a ratio to the bare endpoint's.
3. latency: workers paced so the aggregate rate is half of what (2) reached; the time from
   each token's XADD (the Redis stream id, ms clock of the Redis server on this machine) to
   its receipt by the client, p50 and p99. The workers run at nice 10 here: in production
   they are on other machines, and on two shared cores their run-queue delay would be
   measured instead of the relay's. CPU steal (the hypervisor's share) is printed with each.

With `--cluster N` the streams live on a valkey cluster of N primaries on loopback
(STREAMS_REDIS_URL=redis+cluster://..., one reader per shard: api/streaming/reader.py) and the queues on
their own server; only tokenspool's relay runs then (the per-stream baseline reads one server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.loadgen import Stream, run_streams
from contract.servers import sync_client
from devstack.cluster import start_cluster
from devstack.processes import Proc, _spawn, _wait, free_port, start_redis
from devstack.sse_contract import check_stream

MODEL = "synthetic-bench"
HOLD_TOKENS = 16
API_ENV = {
    "KNOWN_MODELS": MODEL,  # accepted while no worker runs
    "MAX_QUEUE_DEPTH": "0",
    "KEEPALIVE_SECONDS": "5",
    "QUEUE_WAIT_SECONDS": "600",
    "REDIS_POOL_SIZE": "50",
    "LOG_LEVEL": "WARNING",
    "ALLOW_NO_AUTH": "1",  # a private API on loopback
}


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds so far of a process, or of one of its threads."""
    stat = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_connections(pid: int, redis_ports: set[int]) -> int:
    """TCP connections from process `pid` to the Redis ports (its sockets in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        remote_port = int(cols[2].split(":")[1], 16)
        if remote_port in redis_ports and cols[9] in inodes and cols[3] == "01":  # ESTABLISHED
            count += 1
    return count


def steal_share() -> tuple[int, int]:
    """(steal, total) jiffies of this VM so far: time the hypervisor gave to others."""
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return vals[7], sum(vals)


def words(n: int) -> str:
    return "".join(f" w{i}" for i in range(n))


def payload(tokens: int) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "max_tokens": tokens,
    }


def correct(s: Stream, tokens: int) -> bool:
    if s.error or s.status != 200:
        return False
    try:
        parsed = check_stream(bytes(s.body), "chat")
    except (AssertionError, ValueError):
        return False
    return parsed.error is None and parsed.text == words(tokens) and parsed.finish_reason == "length"


def content_events(s: Stream) -> int:
    return bytes(s.body).count(b'"content":" w')


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


class Bench:
    def __init__(self, logs: Path, workers: int, cluster: int = 0) -> None:
        self.logs = logs
        self.n_workers = workers
        self.redis_proc, self.url = start_redis(logs)
        self.r = redis.Redis.from_url(self.url)
        self.env = {"REDIS_URL": self.url}
        self.stream_procs: list[Proc] = []
        self.redis_ports = {_port(self.url)}
        if cluster:
            self.stream_procs, streams_url = start_cluster(logs, masters=cluster)
            self.env["STREAMS_REDIS_URL"] = streams_url
            nodes = sync_client(streams_url).get_primaries()
            self.redis_ports |= {n.port for n in nodes}
        self.relays = ("hub",) if cluster else ("hub", "per-stream")
        self.apis: dict[str, tuple[Proc, int]] = {}
        self.workers: list[Proc] = []
        self.bare: tuple[Proc, int] | None = None
        try:
            for name, factory in (("hub", "api.app"), ("per-stream", "bench.lib.per_stream_relay")):
                if name in self.relays:
                    self.apis[name] = _uvicorn(f"api-{name}", factory, logs, {**self.env, **API_ENV})
            self.bare = _uvicorn("bare", "bench.lib.bare_sse", logs, {"LOG_LEVEL": "WARNING"})
            for proc, port in [*self.apis.values(), self.bare]:
                _wait(lambda p=port: _up(p), 30, proc)
        except BaseException:
            self.close()
            raise

    def start_workers(self, tokens: int, rate: float, nice: int = 0) -> None:
        self.stop_workers()
        for i in range(self.n_workers):
            env = {
                "ENGINE": "synthetic",
                "MODEL_NAME": MODEL,
                "SYNTHETIC_TOKENS": str(tokens),
                "SYNTHETIC_RATE": str(rate),
                "LOG_LEVEL": "WARNING",
            }
            env |= {**self.env, "WORKER_NAME": f"syn{i}"}
            argv = ["nice", "-n", str(nice), sys.executable, "-m", "worker"]
            self.workers.append(_spawn(f"syn{i}", argv, self.logs, env))
        deadline = time.monotonic() + 30
        while self.r.zcard(f"ts:workers:{MODEL}") < self.n_workers:
            if time.monotonic() > deadline:
                raise TimeoutError("synthetic workers did not announce themselves")
            time.sleep(0.1)

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []
        self.r.delete(f"ts:workers:{MODEL}")

    def close(self) -> None:
        self.stop_workers()
        for proc, _ in [*self.apis.values(), *([self.bare] if self.bare else [])]:
            proc.stop()
        for p in (self.redis_proc, *self.stream_procs):
            p.stop()

    async def hold(self, relay: str, n: int) -> dict:
        """N streams opened with no worker running, then served."""
        self.stop_workers()
        proc, port = self.apis[relay]
        base_rss = rss_kb(proc.pid)
        task = asyncio.create_task(run_streams("127.0.0.1", port, payload(HOLD_TOKENS), n))
        last, since = -1, time.monotonic()
        while (queued := self.r.llen(f"rq:queue:{MODEL}")) < n and not task.done():
            if queued != last:
                last, since = queued, time.monotonic()
            elif time.monotonic() - since > 10:  # no progress: some requests were refused
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # every stream has sent its role chunk and is waiting
        held_rss = rss_kb(proc.pid)
        clients = redis_connections(proc.pid, self.redis_ports)
        self.start_workers(HOLD_TOKENS, 0)
        streams, _ = await task
        ok = sum(correct(s, HOLD_TOKENS) for s in streams)
        errors = sorted({s.error or str(s.status) for s in streams if not correct(s, HOLD_TOKENS)})
        return {
            "relay": relay,
            "streams": n,
            "ok": ok,
            "rss_per_stream_kb": (held_rss - base_rss) / n,
            "redis_clients": clients,
            "errors": errors[:3],
        }

    def cpu(self, target: str) -> dict[str, float]:
        procs = {"client": os.getpid()}
        procs["server"] = self.bare[0].pid if target == "bare" else self.apis[target][0].pid
        out = {k: cpu_s(p) for k, p in procs.items()}
        out["redis"] = sum(cpu_s(p.pid) for p in (self.redis_proc, *self.stream_procs))
        out["workers"] = sum(cpu_s(w.pid) for w in self.workers) if target != "bare" else 0.0
        return out

    async def throughput(self, target: str, streams: int, tokens: int) -> dict:
        port = self.bare[1] if target == "bare" else self.apis[target][1]
        before = self.cpu(target)
        got, wall = await run_streams("127.0.0.1", port, payload(tokens), streams)
        after = self.cpu(target)
        ok = sum(correct(s, tokens) for s in got)
        events = sum(content_events(s) for s in got)
        per_k = {k: (after[k] - before[k]) / events * 1e6 for k in before}  # CPU µs per event
        return {
            "target": target,
            "streams": streams,
            "ok": ok,
            "events_per_s": events / wall,
            "cpu_us": per_k,
        }

    async def latency(self, relay: str, streams: int, tokens: int) -> dict:
        _, port = self.apis[relay]
        got, wall = await run_streams("127.0.0.1", port, payload(tokens), streams, latency=True)
        lat = sorted(x for s in got for x in s.latencies_ms)
        ok = sum(correct(s, tokens) for s in got)
        events = sum(content_events(s) for s in got)
        return {
            "relay": relay,
            "ok": ok,
            "streams": streams,
            "events_per_s": events / wall,
            "p50_ms": statistics.median(lat),
            "p99_ms": lat[int(len(lat) * 0.99) - 1],
            "samples": len(lat),
        }


def _uvicorn(name: str, module: str, logs: Path, env: dict[str, str]) -> tuple[Proc, int]:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory", f"{module}:create_app", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--no-access-log", "--backlog", "4096", "--loop", "uvloop"]
    return _spawn(name, argv, logs, env), port


def _up(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="500,1000,2000", help="stream counts for the held-open test")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per stream for throughput and latency")
    ap.add_argument("--rounds", type=int, default=3, help="alternated repetitions of throughput and latency")
    ap.add_argument(
        "--worker-nice", type=int, default=10, help="nice value of the workers in the latency test"
    )
    ap.add_argument(
        "--cluster", type=int, default=0, help="streams on a cluster of N primaries (0: one server)"
    )
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="scale-out-"))
    bench = Bench(logs, args.workers, args.cluster)
    relays = bench.relays
    try:
        print(f"logs: {logs}")
        where = f"a cluster of {args.cluster} primaries" if args.cluster else "the same server as the queues"
        print(f"streams on {where}")
        print("\n## held open (no worker while they open, then served)")
        for relay in relays:  # warm-up: allocator pools, code paths, connection pools
            await bench.hold(relay, 200)
        for n in (int(x) for x in args.streams.split(",")):
            for relay in relays:
                r = await bench.hold(relay, n)
                print(
                    f"{r['relay']:>10} {r['streams']:>5} streams: {r['ok']} ok, "
                    f"{r['rss_per_stream_kb']:.1f} KB RSS per open stream, "
                    f"{r['redis_clients']} API connections to Redis while held {r['errors'] or ''}"
                )

        print(f"\n## throughput ({args.workers} workers, unlimited rate, {args.tokens} tokens per stream)")
        bench.start_workers(args.tokens, 0)
        streams = args.workers * 2
        rates: dict[str, list[float]] = {t: [] for t in ("bare", *relays)}
        for _ in range(args.rounds):
            for target in ("bare", *relays):
                r = await bench.throughput(target, streams, args.tokens)
                rates[target].append(r["events_per_s"])
                cpu = ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_us"].items())
                print(
                    f"{target:>10}: {r['events_per_s']:8.0f} events/s, {r['ok']}/{streams} ok; "
                    f"CPU µs/event: {cpu}"
                )
        med = {t: statistics.median(v) for t, v in rates.items()}
        for relay in relays:
            print(f"{relay:>10}: median {med[relay]:.0f} events/s = {med[relay] / med['bare']:.2f} of bare")

        half = med["hub"] / 2
        rate = half / args.workers
        print(
            f"\n## latency at half the rate reached: {half:.0f} events/s, {args.workers} x {rate:.0f} tok/s "
            f"(workers at nice {args.worker_nice}: in production they run on other machines)"
        )
        bench.start_workers(args.tokens, rate, nice=args.worker_nice)
        lat: dict[str, list[dict]] = {relay: [] for relay in relays}
        for _ in range(args.rounds):
            for relay in relays:
                s0 = steal_share()
                r = await bench.latency(relay, args.workers, args.tokens)
                s1 = steal_share()
                r["steal"] = (s1[0] - s0[0]) / max(s1[1] - s0[1], 1)
                lat[relay].append(r)
                print(
                    f"{relay:>10}: append->receipt p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms "
                    f"({r['samples']} tokens, {r['events_per_s']:.0f} events/s, {r['ok']}/{r['streams']} ok, "
                    f"CPU steal {r['steal']:.0%})"
                )
        for relay in relays:
            p50 = statistics.median(r["p50_ms"] for r in lat[relay])
            p99 = statistics.median(r["p99_ms"] for r in lat[relay])
            print(f"{relay:>10}: median over rounds: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    finally:
        bench.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main())
