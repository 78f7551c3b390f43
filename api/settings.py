"""API settings, read once from the environment (see the README's configuration table)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from api.requests import Limits
from contract.queueing import Recovery


def _keys(raw: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def _limits(raw: str) -> dict[str, int]:
    """`model=N,other=M` -> {model: N, other: M}."""
    out = {}
    for item in _keys(raw):
        model, sep, value = item.rpartition("=")
        if not sep or not model.strip() or not value.strip().isdigit():
            raise ValueError(f"QUEUE_LIMITS: expected model=N, got {item!r}")
        out[model.strip()] = int(value)
    return out


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # clear or sha256:<hex>; none: no auth
    api_keys_file: str | None = None  # more keys, one per line, re-read when the file changes
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API; none: CORS off
    max_body_bytes: int = 1_000_000
    keepalive_s: float = 15.0
    queue_wait_s: float = 600.0  # a job not started by then ends with queue_timeout
    worker_stale_s: float = 15.0  # a worker silent this long no longer counts
    redis_timeout_s: float = 5.0  # any single Redis command
    redis_pool: int = 50  # connections shared by all requests (plus one stream reader)
    redis_pool_wait_s: float = 30.0  # a burst of requests queues this long for a connection
    cancel_grace_s: float = 5.0  # a job whose client went away stops after this long
    outage_s: float = 10.0  # a stream whose Redis is unreachable this long ends with an error
    reaper_interval_s: float = 0.5  # how often dead attempts are looked for
    reaper_settle_s: float = 5.0  # no reaping this soon after a Redis (re)start
    known_models: tuple[str, ...] = ()  # accepted with no live worker: they scale from zero
    max_queue_depth: int = 1000  # jobs waiting per model before 429 (0: no limit)
    queue_limits: dict[str, int] = field(default_factory=dict)  # per-model overrides
    retry_after_s: int = 5  # the Retry-After sent with 429
    max_jobs_per_key: int = 64  # unfinished jobs per API key, cluster-wide (0: no limit)
    max_streams_per_key: int = 64  # open streams per API key, per API process (0: no limit)
    limits: Limits = field(default_factory=Limits)
    recovery: Recovery = field(default_factory=Recovery)  # retention, attempts, timeouts
    job_deadline_s: float = 0.0  # a job not finished this long after its request fails (0: none)

    def queue_limit(self, model: str) -> int:
        return self.queue_limits.get(model, self.max_queue_depth)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        d = cls()
        return cls(
            redis_url=e.get("REDIS_URL", d.redis_url),
            api_keys=_keys(e.get("API_KEYS", "")),
            api_keys_file=e.get("API_KEYS_FILE") or None,
            cors_origins=_keys(e.get("CORS_ORIGINS", "")),
            max_body_bytes=int(e.get("MAX_BODY_BYTES", d.max_body_bytes)),
            keepalive_s=float(e.get("KEEPALIVE_SECONDS", d.keepalive_s)),
            queue_wait_s=float(e.get("QUEUE_WAIT_SECONDS", d.queue_wait_s)),
            worker_stale_s=float(e.get("WORKER_STALE_SECONDS", d.worker_stale_s)),
            redis_timeout_s=float(e.get("REDIS_TIMEOUT_SECONDS", d.redis_timeout_s)),
            redis_pool=int(e.get("REDIS_POOL_SIZE", d.redis_pool)),
            redis_pool_wait_s=float(e.get("REDIS_POOL_WAIT_SECONDS", d.redis_pool_wait_s)),
            cancel_grace_s=float(e.get("CANCEL_GRACE_SECONDS", d.cancel_grace_s)),
            outage_s=float(e.get("STREAM_OUTAGE_SECONDS", d.outage_s)),
            reaper_interval_s=float(e.get("REAPER_INTERVAL_SECONDS", d.reaper_interval_s)),
            reaper_settle_s=float(e.get("REAPER_SETTLE_SECONDS", d.reaper_settle_s)),
            known_models=_keys(e.get("KNOWN_MODELS", "")),
            max_queue_depth=int(e.get("MAX_QUEUE_DEPTH", d.max_queue_depth)),
            queue_limits=_limits(e.get("QUEUE_LIMITS", "")),
            retry_after_s=int(e.get("RETRY_AFTER_SECONDS", d.retry_after_s)),
            max_jobs_per_key=int(e.get("MAX_JOBS_PER_KEY", d.max_jobs_per_key)),
            max_streams_per_key=int(e.get("MAX_STREAMS_PER_KEY", d.max_streams_per_key)),
            limits=Limits(
                max_messages=int(e.get("MAX_MESSAGES", d.limits.max_messages)),
                max_prompt_chars=int(e.get("MAX_PROMPT_CHARS", d.limits.max_prompt_chars)),
                max_tokens=int(e.get("MAX_TOKENS_LIMIT", d.limits.max_tokens)),
                max_stop=int(e.get("MAX_STOP", d.limits.max_stop)),
                max_stop_chars=int(e.get("MAX_STOP_CHARS", d.limits.max_stop_chars)),
            ),
            job_deadline_s=float(e.get("JOB_DEADLINE_SECONDS", d.job_deadline_s)),
            recovery=Recovery.from_env(e),
        )
