"""`python -m worker`: load the model once, announce it, and take its jobs until stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import redis

from contract import keys, logs
from contract.servers import sync_client
from contract.tiers import embedding_pool, rank_pool, served_model
from worker.attempts.durability import Durability
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.runner import JobRunner
from worker.engine import sizing
from worker.engine.protocol import Engine
from worker.hub_model import ModelUnavailable, fetch
from worker.intake.lending import Lending
from worker.intake.presence import Presence, Starting
from worker.intake.rqworker import TokenspoolWorker
from worker.redis.link import Link
from worker.settings import WorkerSettings

log = logging.getLogger("worker")


def prepare_libgomp(settings: WorkerSettings) -> None:
    """Tell libgomp how long llama.cpp's threads spin at a barrier (`sizing.spin_count`). It reads
    GOMP_SPINCOUNT once, as llama.cpp loads, so this comes before that import."""
    if (spin := sizing.spin_count(settings.gomp_spincount, settings.n_gpu_layers)) is not None:
        os.environ["GOMP_SPINCOUNT"] = str(spin)


def load_engine(settings: WorkerSettings) -> Engine:
    """The model's engine. It is for its embedding pool when POOLING (or the GGUF) says so, or its
    rerank pool for rank pooling. Else it is for chat and completions. `engine.model_name` names the
    pool the worker serves."""
    if settings.engine == "synthetic":
        from worker.engine.synthetic import SyntheticEngine

        return SyntheticEngine(
            settings.model_name,
            settings.n_ctx,
            settings.synthetic_tokens,
            settings.synthetic_rate,
            settings.slots,
            settings.synthetic_load_s,
            settings.synthetic_tool_calls,
        )
    prepare_libgomp(settings)
    # llama_cpp: only workers that need it
    from worker.engine.embedding.pooling import declared_pooling

    assert settings.model_path is not None
    pooling = settings.pooling or declared_pooling(settings.model_path)
    if pooling == "rank":
        from worker.engine.embedding.rank import RankEngine

        log.info("loading %s from %s for reranking", settings.model_name, settings.model_path)
        return RankEngine(settings)
    if pooling != "none" and pooling:
        from worker.engine.embedding.engine import EmbeddingEngine

        log.info("loading %s from %s for embeddings", settings.model_name, settings.model_path)
        return EmbeddingEngine(settings, pooling)
    from worker.engine.model import LlamaEngine

    log.info("loading %s from %s", settings.model_name, settings.model_path)
    started = time.monotonic()
    engine = LlamaEngine(settings)
    log.info("loaded in %.2fs", time.monotonic() - started)
    return engine


def start_engine(settings: WorkerSettings, waiting: Callable[[], bool]) -> Engine:
    """Fetch the model if it comes from the Hub, then load it. Warm it up until a job is `waiting`."""
    if (hub := settings.hub_model) is not None:
        try:
            settings = dataclasses.replace(settings, model_path=fetch(hub))
        except ModelUnavailable as exc:
            # the one line that says what to do
            log.error("%s", exc)
            raise SystemExit(2) from None
    engine = load_engine(settings)
    # before it announces itself: its first job is as fast as any
    if settings.warm_up_s:
        engine.warm_up(settings.warm_up_s, waiting)
    return engine


class Part(Protocol):
    """A thread beside the loop: the start-up notice, presence, heartbeat, durability."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@contextlib.contextmanager
def running(part: Part) -> Iterator[None]:
    part.start()
    try:
        yield
    finally:
        part.stop()


@dataclass
class Loop:
    """What `WorkerProcess.serve` runs: the loop and its job runner. It also holds the parts that
    say the worker serves (presence) and that watch its attempts (heartbeat, durability)."""

    worker: TokenspoolWorker
    runner: JobRunner
    presence: Presence
    heartbeat: Heartbeat
    durability: Durability | None


class WorkerProcess:
    """One worker process: it loads the model once, announces it, and takes its jobs until stopped.
    Each thread beside the loop starts on one ExitStack. So it stops however the process ends, the
    last started first."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings

    def connect(self, url: str = "") -> redis.Redis:
        """A client of REDIS_URL (or `url`). Its connections are named. When this process dies, the
        API sees them vanish at once."""
        name = keys.WORKER_CONNECTION_PREFIX + self.settings.name
        return sync_client(url or self.settings.shared.redis_url, client_name=name, health_check_interval=10)

    def run(self) -> None:
        settings = self.settings
        with contextlib.ExitStack() as parts:
            starting = Starting(self.connect(), self.pool(), settings.name, settings.announce_s)
            # until it serves: said before it stops saying it is starting
            with running(starting):
                engine = start_engine(settings, starting.jobs_waiting)
                loop = self.build(engine)
                with contextlib.suppress(redis.RedisError):
                    loop.presence.announce()
                parts.enter_context(running(loop.presence))
            parts.enter_context(running(loop.heartbeat))
            if loop.durability is not None:
                parts.enter_context(running(loop.durability))
            log.info(
                "worker %s serving %s (%d slots of %d tokens)",
                settings.name,
                engine.model_name,
                engine.slots,
                engine.n_ctx,
            )
            self.serve(loop)

    def pool(self) -> str:
        """The pool the worker starts for. An embedding pool's name is known before the load only
        when POOLING says it is one. After the load, `engine.model_name` says."""
        settings = self.settings
        if settings.pooling in ("", "none"):
            return settings.model_name
        return (rank_pool if settings.pooling == "rank" else embedding_pool)(settings.model_name)

    def build(self, engine: Engine) -> Loop:
        """The loop and its parts, on the loaded engine. Nothing is started yet."""
        settings, connect = self.settings, self.connect
        streams_url = settings.shared.streams_url
        split = streams_url != settings.shared.redis_url
        window_ms = int(settings.heartbeat_window_s * 1000)
        heartbeat = Heartbeat(
            connect(streams_url),
            window_ms,
            interval_s=settings.heartbeat_window_s / 3,
            stall_s=settings.stall_s,
        )
        # what a failover could take back, written again if it does (worker/attempts/durability.py)
        durability = (
            Durability(connect(streams_url), period_s=settings.durability_s)
            if settings.durability_s
            else None
        )
        if settings.log_content:
            log.warning("LOG_CONTENT=1: prompts and completions will be written to the log")
        link = Link(
            connect(),
            settings.name,
            settings.recovery,
            redis_wait_s=settings.redis_wait_s,
            streams_client=connect(streams_url) if split else None,
        )
        runner = JobRunner(
            engine,
            link,
            heartbeat,
            window_ms,
            durability,
            # With several slots, one round trip per batch step rather than one per token.
            linger_s=0.002 if engine.slots > 1 else 0.0,
            shutdown_grace_s=settings.shutdown_grace_s,
            log_content=settings.log_content,
            slots=engine.slots,
            guest=served_model(engine.model_name)[1] != "chat",
        )
        # the model's name, or its embedding pool's (contract/tiers.py)
        pool = engine.model_name
        # MMPROJ_PATH's encoder
        vision = getattr(getattr(engine, "prompts", None), "vision", None)
        presence = Presence(
            connect(),
            pool,
            settings.name,
            settings.announce_s,
            slots=engine.slots,
            counters=lambda: engine.counters().plus(runner.counters),
            n_ctx=engine.n_ctx,
            overhead=engine.prompt_overhead,
            placement=engine.placement,
            held=engine.held,
            load=lambda: (runner.running(), engine.step_ms()),
            vision=vision.max_tokens if vision is not None else 0,
        )
        # an image job's bytes, read by its hash within its cache scope
        if vision is not None:
            images = connect()
            engine.prompts.fetch_image = lambda scope, sha: images.get(keys.image(scope, sha))  # type: ignore[attr-defined]
        if engine.held is not None:
            engine.held.changed = presence.held_changed
        connection = connect()
        lending = Lending(
            connection,
            pool,
            settings.name,
            batch_slots=settings.batch_share(engine.slots),
            lend_slots=settings.batch_lend_share(engine.slots),
            lend_after_s=settings.batch_lend_after_s,
            poll_s=settings.preempt_poll_s,
        )
        worker = TokenspoolWorker(pool, settings.name, connection, runner, lending)
        return Loop(worker, runner, presence, heartbeat, durability)

    def serve(self, loop: Loop) -> None:
        """Take jobs until stopped, then let the running ones finish (SIGTERM). A second signal, or
        Ctrl-C twice, hands them off instead."""
        runner, durability = loop.runner, loop.durability
        # With IDLE_EXIT_SECONDS the process exits (model unloaded) once no job came for that
        # long: an autoscaler then brings workers back from the queue depth (docs/operations.md).
        idle = int(self.settings.idle_exit_s) if self.settings.idle_exit_s else None
        try:
            loop.worker.work(max_idle_time=idle)
            # takes no more jobs: routing sends none here
            loop.presence.withdraw()
            if runner.running():
                log.info("waiting for %d running jobs (or their hand-off)", runner.running())
            runner.drain()
            if durability is not None:
                # the last writes on a replica before nobody holds them
                durability.settle(5.0)
        # cold shutdown: hand the running jobs off
        except (SystemExit, KeyboardInterrupt):
            loop.presence.withdraw()
            runner.request_shutdown(0.0)
            runner.drain(timeout=10.0)
            raise


def main() -> None:
    settings = WorkerSettings.from_env()
    logs.configure("worker", settings.shared)
    WorkerProcess(settings).run()


if __name__ == "__main__":
    main()
