"""`GET /metrics` in Prometheus text format.

Two kinds of figures. Cluster-wide ones are read from Redis at each scrape. They are the same
on every API replica (take `max`, not `sum`, across replicas). They are queue depth,
in-flight attempts, and live workers and their slots per model. They also cover tokens
generated, attempts requeued after a crash or a hand-off, and jobs lost. Redis's memory is
shown against its maxmemory. It is the fullest server's, as read once a second for the
`storage_full` refusal. Each key's budget use this minute is there too
(api/ops/key_metrics.py). So is what the workers' batching schedulers did: decode steps,
sequences in them, prompt tokens computed, slot moves, steps interrupted. Each worker's
announcement adds these, so they are up to a few seconds late.

Per-process ones are kept in this process's own registry (sum them across replicas). They
are open streams, time to first token, inter-token latency, resumed streams, and rejected
requests by reason.
"""

from __future__ import annotations

from dataclasses import fields

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from api.jobs.workers import WorkerLoad
from api.metrics import Metrics
from api.ops import key_metrics
from contract.stats import LEVELS, BatchCounters, StatField

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_BATCH_HELP = {
    "steps": "Batch steps (llama_decode calls) the workers ran.",
    "sequences": "Sequences in those steps, summed: divided by the steps, the mean batch occupancy.",
    "prefill_tokens": "Prompt tokens computed (not those a slot's cached prefix already held).",
    "moves": "Sequences moved into a lower free slot to keep the running slots consecutive.",
    "kept": "Ended conversations' caches copied to a spare slot out of such a move's way.",
    "copied": "New jobs' prompt prefixes copied from another slot's cache, not read again.",
    "interrupted": "Steps of Batch API lines stopped part way for an interactive job's prompt.",
    "decode_us": "Microseconds inside llama_decode.",
    "wait_us": "Microseconds from llama_decode's return to its logits (a GPU still computing).",
    "sample_us": "Microseconds picking the sequences' tokens from each step's logits.",
    "token_us": "Microseconds of the job threads' own work per token (stops, tool calls, logprobs).",
    "tokens": "Tokens the job threads handled.",
    "publish_us": "Microseconds of the publisher's round trips to Redis.",
    "publishes": "The publisher's round trips to Redis.",
    "prompt_tokens": "Prompt tokens of the jobs admitted into slots.",
    "cached_tokens": "Of them, those a slot's cache already held: prompt tokens saved.",
    "routed_taken": "Routed jobs taken by the worker they were routed to (the router's hits).",
    "host_hits": "Jobs whose prompt prefix was restored from a worker's host memory into their slot.",
    "host_restored_tokens": "Prompt tokens those restores held (counted in cached_tokens too).",
    "host_saved": "Slots' KV states kept in host memory before the slot was written over.",
    "host_evictions": "Kept states dropped for HOST_CACHE_MIB, least recently used first.",
}


class _Snapshot(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


async def cluster(request: Request) -> list[Metric]:
    services = request.state.services
    served = await services.admission.models()
    in_flight = await services.stats.in_flight()
    names = sorted(set(served) | set(in_flight))
    depths = await services.stats.queue_depths(names)
    batch_running = await services.stats.in_flight(batch=True)
    slots = await services.registry.slots(names)
    placed = await services.registry.placements(names)
    loads = await services.registry.loads(names)
    stats = await services.stats.counters()

    def per_model(family: GaugeMetricFamily | CounterMetricFamily, values: dict[str, int]) -> Metric:
        for m in names:
            family.add_metric([m], values.get(m, 0))
        return family

    requeued = CounterMetricFamily(
        "tokenspool_attempts_requeued", "Attempts taken over by another worker.", labels=["reason"]
    )
    for reason in ("crash", "handoff", "preempt"):
        requeued.add_metric([reason], stats.get(StatField.requeued(reason), 0))
    tokens = {m: stats.get(StatField.tokens(m), 0) for m in names}
    batching = [
        per_model(
            CounterMetricFamily(f"tokenspool_batch_{counter}", _BATCH_HELP[counter], labels=["model"]),
            {m: stats.get(StatField.batch(counter, m), 0) for m in names},
        )
        for counter in (f.name for f in fields(BatchCounters) if f.name not in LEVELS)
    ]
    by_tier = GaugeMetricFamily(
        "tokenspool_queue_depth_by_tier",
        "Jobs waiting, by tier (priority, default, flex, batch; suspect: their worker died with them).",
        labels=["model", "tier"],
    )
    for m in names:
        for tier, n in depths[m].items():
            by_tier.add_metric([m, tier], n)
    return [
        per_model(
            GaugeMetricFamily("tokenspool_queue_depth", "Jobs waiting.", labels=["model"]),
            {m: sum(d.values()) for m, d in depths.items()},
        ),
        by_tier,
        per_model(
            GaugeMetricFamily("tokenspool_jobs_in_flight", "Attempts running.", labels=["model"]), in_flight
        ),
        per_model(
            GaugeMetricFamily(
                "tokenspool_batch_lines_in_flight", "Batch API lines running.", labels=["model"]
            ),
            batch_running,
        ),
        per_model(GaugeMetricFamily("tokenspool_workers", "Live workers.", labels=["model"]), served),
        per_model(
            GaugeMetricFamily("tokenspool_slots", "Jobs the live workers can run at once.", labels=["model"]),
            slots,
        ),
        per_model(
            GaugeMetricFamily(
                "tokenspool_gpu_layers",
                "Layers offloaded to the GPU, by the live worker that offloads the fewest.",
                labels=["model"],
            ),
            {m: min(layers for layers, _ in p) for m, p in placed.items() if p},
        ),
        per_model(
            GaugeMetricFamily(
                "tokenspool_kv_cache_bytes", "KV cache of the live workers, summed.", labels=["model"]
            ),
            {m: sum(kv for _, kv in p) for m, p in placed.items()},
        ),
        per_model(
            CounterMetricFamily("tokenspool_tokens_generated", "Tokens generated.", labels=["model"]), tokens
        ),
        per_model(
            CounterMetricFamily(
                "tokenspool_routed_jobs",
                "New jobs routed to the worker holding their prefix.",
                labels=["model"],
            ),
            {m: stats.get(StatField.routed(m), 0) for m in names},
        ),
        per_model(
            CounterMetricFamily(
                "tokenspool_route_fallbacks",
                "Routed jobs back in the shared queue: not taken in time, or their worker died.",
                labels=["model"],
            ),
            {m: stats.get(StatField.route_fallbacks(m), 0) for m in names},
        ),
        requeued,
        CounterMetricFamily(
            "tokenspool_jobs_lost", "Jobs ended with worker_lost.", value=stats.get(StatField.LOST, 0)
        ),
        GaugeMetricFamily(
            "tokenspool_redis_memory_used_bytes",
            "Memory Redis uses (the fullest server: STREAMS_REDIS_URL's nodes too).",
            value=services.memory.used,
        ),
        GaugeMetricFamily(
            "tokenspool_redis_memory_max_bytes",
            "That server's maxmemory (0: none set); new jobs are refused past REDIS_MEMORY_HIGH of it.",
            value=services.memory.maxmemory,
        ),
        *batching,
        *_per_worker(loads),
        *await key_metrics.budget_use(services),
    ]


def _per_worker(loads: dict[str, list[WorkerLoad]]) -> list[Metric]:
    """Each live worker as it last announced itself: the pool view's rows."""
    families = {
        "slots": GaugeMetricFamily(
            "tokenspool_worker_slots", "The worker's SLOTS.", labels=["model", "worker"]
        ),
        "in_use": GaugeMetricFamily(
            "tokenspool_worker_slots_in_use", "Its slots running a job.", labels=["model", "worker"]
        ),
        "step": GaugeMetricFamily(
            "tokenspool_worker_step_seconds", "Its last batch step's time.", labels=["model", "worker"]
        ),
        "prompt": CounterMetricFamily(
            "tokenspool_worker_prompt_tokens", "Prompt tokens its slots took.", labels=["model", "worker"]
        ),
        "cached": CounterMetricFamily(
            "tokenspool_worker_cached_tokens", "Of them, held by a slot's cache.", labels=["model", "worker"]
        ),
        "host": GaugeMetricFamily(
            "tokenspool_worker_host_cache_bytes",
            "KV states its host tier keeps now (HOST_CACHE_MIB bounds it).",
            labels=["model", "worker"],
        ),
    }
    for model, workers in loads.items():
        for w in workers:
            labels = [model, w.name]
            families["slots"].add_metric(labels, w.slots)
            families["in_use"].add_metric(labels, w.in_use)
            families["step"].add_metric(labels, w.step_ms / 1000)
            families["prompt"].add_metric(labels, w.prompt_tokens)
            families["cached"].add_metric(labels, w.cached_tokens)
            families["host"].add_metric(labels, w.host_bytes)
    return list(families.values())


async def metrics(request: Request) -> Response:
    own: Metrics = request.state.services.metrics
    snapshot = CollectorRegistry()
    snapshot.register(_Snapshot(await cluster(request)))
    body = generate_latest(own.registry) + generate_latest(snapshot)
    return Response(body, media_type=CONTENT_TYPE)
