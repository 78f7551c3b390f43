"""What the worker pool serves: the model list, and one model's demand for autoscalers."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from api.http.errors import invalid
from api.jobs.admission import not_found
from api.services import Services
from contract import tiers

WORKERS = {"chat": "workers", "embeddings": "embedding_workers", "rerank": "rerank_workers"}
POOLS = {"chat": lambda name: name, "embeddings": tiers.embedding_pool, "rerank": tiers.rank_pool}


def _models(pools: dict[str, int]) -> dict[str, dict]:
    """One entry per model, from its pools' live workers. `workers` are its chat workers,
    `embedding_workers` its embedding pool's, and `rerank_workers` its rerank pool's. These
    are tokenspool's fields, beside OpenAI's. `kinds` is what it serves ("chat",
    "embeddings", "rerank")."""
    out: dict[str, dict] = {}
    for pool, workers in pools.items():
        name, kind = tiers.served_model(pool)
        entry = out.setdefault(
            name,
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "tokenspool",
                "workers": 0,
                "kinds": [],
            },
        )
        entry["kinds"] = sorted([*entry["kinds"], kind])
        entry[WORKERS[kind]] = workers
    return out


async def list_models(request: Request) -> JSONResponse:
    services: Services = request.state.services
    live = await services.admission.models()
    return JSONResponse({"object": "list", "data": list(_models(live).values())})


async def get_model(request: Request) -> JSONResponse:
    services: Services = request.state.services
    name = request.path_params["model"]
    live = _models(await services.admission.models([pool(name) for pool in POOLS.values()]))
    if name not in live:
        raise not_found(name)
    return JSONResponse(live[name])


async def scaling(request: Request) -> JSONResponse:
    """One model's demand, for an autoscaler (KEDA's metrics-api scaler reads `demand`).

    It is jobs waiting plus attempts running: how many single-job workers would be busy.
    `slots` is how many jobs the live workers can run at once (their SLOTS, summed). The
    Batch API's lines are counted apart too (`batch_queued`, `batch_in_flight`,
    `interactive_demand`). A pool may scale on interactive demand alone. The jobs waiting in
    each tier's queue are counted too (`queued_by_tier`). `?kind=embeddings` asks for the
    model's embedding pool, `?kind=rerank` for its rerank pool."""
    services: Services = request.state.services
    name = request.path_params["model"]
    kind = request.query_params.get("kind", "chat")
    if kind not in POOLS:
        raise invalid("Invalid 'kind': one of chat, embeddings and rerank.", param="kind")
    # the model's pool of that kind
    name = POOLS[kind](name)
    served = await services.admission.models([name])
    stats = services.stats
    depths = (await stats.queue_depths([name]))[name]
    queued, batch_queued = sum(depths.values()), depths[tiers.BATCH]
    running, batch_running = (
        (await stats.in_flight()).get(name, 0),
        (await stats.in_flight(True)).get(name, 0),
    )
    slots = (await services.registry.slots([name]))[name]
    if name not in served and not queued and not running:
        raise not_found(name)
    return JSONResponse(
        {
            "model": name,
            "queued": queued,
            "in_flight": running,
            "workers": served.get(name, 0),
            "slots": slots,
            "demand": queued + running,
            "batch_queued": batch_queued,
            "batch_in_flight": batch_running,
            "interactive_demand": queued + running - batch_queued - batch_running,
            "queued_by_tier": depths,
        }
    )
