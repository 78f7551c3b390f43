"""`python -m devstack.dashboards`: writes tokenspool's Grafana dashboards, infra/grafana/*.json,
from the panels declared here (devstack/grafana.py renders them). tests/unit/devstack/
test_dashboards.py checks the files are current and every query parses;
tests/integration/test_prometheus.py, that each names only what a real stack's /metrics
declares."""

from __future__ import annotations

import sys

from devstack.grafana import (
    BUDGETS,
    KEYS,
    RATE,
    ROOM,
    Dashboard,
    Panel,
    Query,
    Row,
    W,
    pool,
    pool_rate,
    quantiles,
    ratio,
    refused,
    write,
)

US = " / 1e6"  # microseconds counted, seconds shown

REDIS_MEMORY = Panel(
    "Redis memory",
    "The fullest Redis server's used memory and maxmemory; past REDIS_MEMORY_HIGH of it new jobs "
    "are refused (503 storage_full).",
    (
        Query("max(tokenspool_redis_memory_used_bytes)", "used"),
        Query("max(tokenspool_redis_memory_max_bytes)", "maxmemory"),
    ),
    "bytes",
)

OVERVIEW = Dashboard(
    "tokenspool-overview",
    "tokenspool: pool overview",
    "Is the pool healthy: workers, slots, queues, tokens, latency, failures.",
    (
        Row(
            "Pool",
            (
                Panel(
                    "Live workers",
                    "Workers that announced the model recently.",
                    (Query(pool("tokenspool_workers"), "{{model}}"),),
                ),
                Panel(
                    "Slots and attempts running",
                    "Jobs the live workers can run at once, and the attempts running now.",
                    (
                        Query(pool("tokenspool_slots"), "{{model}} slots"),
                        Query(pool("tokenspool_jobs_in_flight"), "{{model}} running"),
                    ),
                ),
                Panel(
                    "Jobs waiting",
                    "Jobs in the model's queues, every tier.",
                    (Query(pool("tokenspool_queue_depth"), "{{model}}"),),
                ),
                Panel(
                    "Tokens generated",
                    "Tokens the workers generated, per second.",
                    (Query(pool_rate("tokenspool_tokens_generated_total"), "{{model}}"),),
                    "tps",
                ),
            ),
        ),
        Row(
            "Latency and streams",
            (
                Panel(
                    "Time to first token",
                    "From a request's arrival to its first content chunk sent (new streams only).",
                    quantiles("tokenspool_time_to_first_token_seconds"),
                    "s",
                ),
                Panel(
                    "Inter-token latency",
                    "Between consecutive content chunks sent on a stream.",
                    quantiles("tokenspool_inter_token_latency_seconds"),
                    "s",
                ),
                Panel(
                    "Open streams",
                    "SSE streams the API replicas relay now.",
                    (Query("sum(tokenspool_streams_open)", "open"),),
                ),
                Panel(
                    "Jobs created, by endpoint",
                    "New jobs per second by the endpoint that made them; streams their clients reopened.",
                    (
                        Query(
                            f"sum by (surface) (rate(tokenspool_jobs_created_total[{RATE}]))", "{{surface}}"
                        ),
                        Query(f"sum(rate(tokenspool_streams_resumed_total[{RATE}]))", "resumed"),
                    ),
                    "reqps",
                ),
            ),
        ),
        Row(
            "Failures",
            (
                Panel(
                    "Requests refused, by error code",
                    "Requests answered with an error status, per second.",
                    (
                        Query(
                            f"sum by (reason) (rate(tokenspool_requests_rejected_total[{RATE}]))",
                            "{{reason}}",
                        ),
                    ),
                    "reqps",
                ),
                Panel(
                    "Attempts requeued, by reason",
                    "Attempts taken over by another worker per minute: a crash, a hand-off, a preemption.",
                    (
                        Query(
                            f"{pool_rate('tokenspool_attempts_requeued_total', 'reason', '')} * 60",
                            "{{reason}}",
                        ),
                    ),
                ),
                Panel(
                    "Jobs lost",
                    "Jobs ended with worker_lost (out of attempts), in each interval.",
                    (Query(f"max(increase(tokenspool_jobs_lost_total[{RATE}]))", "lost"),),
                ),
                REDIS_MEMORY,
            ),
        ),
    ),
)

WORKERS = Dashboard(
    "tokenspool-workers",
    "tokenspool: workers",
    "Each live worker as it last announced itself, and what the batching schedulers did.",
    (
        Row(
            "Slots",
            (
                Panel(
                    "Slots in use, by worker",
                    "Slots running a job, of the worker's SLOTS.",
                    (
                        Query(pool("tokenspool_worker_slots_in_use", "worker", W), "{{worker}} in use"),
                        Query(pool("tokenspool_worker_slots", "worker", W), "{{worker}} slots"),
                    ),
                ),
                Panel(
                    "Batch step time, by worker",
                    "The worker's last batch step.",
                    (Query(pool("tokenspool_worker_step_seconds", "worker", W), "{{worker}}"),),
                    "s",
                ),
                Panel(
                    "Prompt tokens taken, by worker",
                    "Prompt tokens the worker's slots took, per second.",
                    (Query(pool_rate("tokenspool_worker_prompt_tokens_total", "worker", W), "{{worker}}"),),
                ),
                Panel(
                    "Prompt cache hits, by worker",
                    "Of those prompt tokens, the share a slot's cache already held.",
                    (
                        Query(
                            ratio(
                                "tokenspool_worker_cached_tokens_total",
                                "tokenspool_worker_prompt_tokens_total",
                                "worker",
                                W,
                            ),
                            "{{worker}}",
                        ),
                    ),
                    "percentunit",
                ),
                Panel(
                    "Host tier, by worker",
                    "KV states the worker keeps in host memory (HOST_CACHE_MIB bounds it).",
                    (Query(pool("tokenspool_worker_host_cache_bytes", "worker", W), "{{worker}}"),),
                    "bytes",
                ),
            ),
        ),
        Row(
            "Placement",
            (
                Panel(
                    "GPU layers",
                    "Layers offloaded to the GPU, by the live worker that offloads the fewest.",
                    (Query(pool("tokenspool_gpu_layers"), "{{model}}"),),
                ),
                Panel(
                    "KV cache",
                    "The live workers' KV cache, summed.",
                    (Query(pool("tokenspool_kv_cache_bytes"), "{{model}}"),),
                    "bytes",
                ),
            ),
        ),
        Row(
            "Batching",
            (
                Panel(
                    "Mean batch occupancy",
                    "Sequences per batch step (llama_decode call).",
                    (
                        Query(
                            ratio("tokenspool_batch_sequences_total", "tokenspool_batch_steps_total"),
                            "{{model}}",
                        ),
                    ),
                ),
                Panel(
                    "Batch steps",
                    "llama_decode calls per second.",
                    (Query(pool_rate("tokenspool_batch_steps_total"), "{{model}}"),),
                ),
                Panel(
                    "A step's time, by stage",
                    "Inside llama_decode, waiting for its logits (a GPU still computing), sampling.",
                    tuple(
                        Query(
                            ratio(f"tokenspool_batch_{stage}_us_total", "tokenspool_batch_steps_total") + US,
                            legend,
                        )
                        for stage, legend in (
                            ("decode", "{{model}} decode"),
                            ("wait", "{{model}} logits wait"),
                            ("sample", "{{model}} sampling"),
                        )
                    ),
                    "s",
                ),
                Panel(
                    "Job threads and publisher",
                    "The job threads' own work per token (stops, tool calls, logprobs); "
                    "a publisher's round trip to Redis.",
                    (
                        Query(
                            ratio("tokenspool_batch_token_us_total", "tokenspool_batch_tokens_total") + US,
                            "{{model}} per token",
                        ),
                        Query(
                            ratio("tokenspool_batch_publish_us_total", "tokenspool_batch_publishes_total")
                            + US,
                            "{{model}} per publish",
                        ),
                    ),
                    "s",
                ),
            ),
        ),
    ),
    workers=True,
)

QUEUES = Dashboard(
    "tokenspool-queues",
    "tokenspool: queues, routing and caches",
    "Where jobs wait, whether the router sends them to the worker holding their prefix, "
    "and what the prompt caches save.",
    (
        Row(
            "Queues",
            (
                Panel(
                    "Jobs waiting, by tier",
                    "priority, default, flex, batch; suspect: their worker died with them.",
                    (Query(pool("tokenspool_queue_depth_by_tier", "model, tier"), "{{model}} {{tier}}"),),
                ),
                Panel(
                    "Batch API lines",
                    "Lines running, and their steps stopped part way for an interactive job's prompt "
                    "(per second).",
                    (
                        Query(pool("tokenspool_batch_lines_in_flight"), "{{model}} running"),
                        Query(pool_rate("tokenspool_batch_interrupted_total"), "{{model}} interrupted"),
                    ),
                ),
            ),
        ),
        Row(
            "Routing",
            (
                Panel(
                    "Routed jobs",
                    "New jobs routed to the worker holding their prefix, and those back in the shared "
                    "queue (not taken in time, or their worker died), per second.",
                    (
                        Query(pool_rate("tokenspool_routed_jobs_total"), "{{model}} routed"),
                        Query(pool_rate("tokenspool_route_fallbacks_total"), "{{model}} fell back"),
                    ),
                ),
                Panel(
                    "Router hits",
                    "Routed jobs taken by the worker they were routed to.",
                    (
                        Query(
                            ratio("tokenspool_batch_routed_taken_total", "tokenspool_routed_jobs_total"),
                            "{{model}}",
                        ),
                    ),
                    "percentunit",
                ),
            ),
        ),
        Row(
            "Prompt caches",
            (
                Panel(
                    "Prompt tokens saved",
                    "Of the prompt tokens admitted into slots, the share a slot's cache already held.",
                    (
                        Query(
                            ratio(
                                "tokenspool_batch_cached_tokens_total", "tokenspool_batch_prompt_tokens_total"
                            ),
                            "{{model}}",
                        ),
                    ),
                    "percentunit",
                ),
                Panel(
                    "Prompt tokens",
                    "Admitted into slots, held by a cache, and computed, per second.",
                    (
                        Query(pool_rate("tokenspool_batch_prompt_tokens_total"), "{{model}} admitted"),
                        Query(pool_rate("tokenspool_batch_cached_tokens_total"), "{{model}} cached"),
                        Query(pool_rate("tokenspool_batch_prefill_tokens_total"), "{{model}} computed"),
                    ),
                ),
                Panel(
                    "Slot moves and copies",
                    "Sequences moved into a lower free slot, ended conversations' caches kept out of "
                    "their way, new jobs' prefixes copied from another slot's cache, per second.",
                    (
                        Query(pool_rate("tokenspool_batch_moves_total"), "{{model}} moved"),
                        Query(pool_rate("tokenspool_batch_kept_total"), "{{model}} kept"),
                        Query(pool_rate("tokenspool_batch_copied_total"), "{{model}} copied"),
                    ),
                    width=24,
                ),
                Panel(
                    "Host tier",
                    "Jobs whose prefix came back from a worker's host memory, slots' states kept there "
                    "and dropped for HOST_CACHE_MIB, per second.",
                    tuple(
                        Query(pool_rate(f"tokenspool_batch_host_{name}_total"), f"{{{{model}}}} {name}")
                        for name in ("hits", "saved", "evictions", "restored_tokens")
                    ),
                ),
            ),
        ),
    ),
)

BUDGETS_DASHBOARD = Dashboard(
    "tokenspool-budgets",
    "tokenspool: budgets and refusals",
    "Each key's budget use this minute and its refusals (by key id: the first METRICS_KEYS keys, "
    "the rest as `other`), then requests refused over a key's budgets, for want of room, or for "
    "the key itself, over every API replica.",
    (
        Row(
            "Per key",
            (
                Panel(
                    "Budget used this minute, by key",
                    "What each key was charged this minute against its per-minute budget (keys with one).",
                    tuple(
                        Query(
                            f'max by (key) (tokenspool_key_budget_used{{budget="{b}"}}) / '
                            f'max by (key) (tokenspool_key_budget_limit{{budget="{b}"}} > 0)',
                            f"{{{{key}}}} {b}",
                        )
                        for b in ("requests", "bytes", "tokens")
                    ),
                    "percentunit",
                ),
                Panel(
                    "Tokens charged this minute, by key",
                    "Prompt and completion tokens each key was charged this minute (reserved at "
                    "admission, settled at the end).",
                    (Query('max by (key) (tokenspool_key_budget_used{budget="tokens"})', "{{key}}"),),
                ),
                Panel(
                    "Refused, by key",
                    "Requests of each key refused, by error code (per second).",
                    (
                        Query(
                            f"sum by (key, reason) (rate(tokenspool_key_requests_rejected_total[{RATE}]))",
                            "{{key}} {{reason}}",
                        ),
                    ),
                    "reqps",
                    width=24,
                ),
            ),
        ),
        Row(
            "Refusals",
            (
                Panel(
                    "Over a key's budgets",
                    "Per-minute request, byte and token budgets; MAX_JOBS_PER_KEY; "
                    "MAX_STREAMS_PER_KEY (per second).",
                    refused(BUDGETS),
                    "reqps",
                ),
                Panel(
                    "For want of room",
                    "Queues full, Redis nearly full, Redis unreachable (per second).",
                    refused(ROOM),
                    "reqps",
                ),
                Panel(
                    "Keys and tiers",
                    "No key, a wrong key, a tier or a route the key may not use (per second).",
                    refused(KEYS),
                    "reqps",
                ),
                REDIS_MEMORY,
            ),
        ),
    ),
)

DASHBOARDS = (OVERVIEW, WORKERS, QUEUES, BUDGETS_DASHBOARD)


def main() -> None:
    for path in write(DASHBOARDS):
        print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
