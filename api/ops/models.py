"""What the worker pool serves: the model list, and one model's demand for autoscalers."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from api.jobs.admission import not_found
from api.services import Services
from contract import tiers


def _model(name: str, workers: int) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tokenspool", "workers": workers}


async def list_models(request: Request) -> JSONResponse:
    services: Services = request.state.services
    live = await services.admission.models()
    return JSONResponse({"object": "list", "data": [_model(m, n) for m, n in live.items()]})


async def get_model(request: Request) -> JSONResponse:
    services: Services = request.state.services
    name = request.path_params["model"]
    live = await services.admission.models([name])
    if name not in live:
        raise not_found(name)
    return JSONResponse(_model(name, live[name]))


async def scaling(request: Request) -> JSONResponse:
    """One model's demand, for an autoscaler (KEDA's metrics-api scaler reads `demand`):
    jobs waiting plus attempts running, i.e. how many single-job workers would be busy.
    `slots` is how many jobs the live workers can run at once (their SLOTS, summed). The
    Batch API's lines are counted apart too (`batch_queued`, `batch_in_flight`,
    `interactive_demand`: a pool may scale on interactive demand alone), and the jobs
    waiting in each tier's queue (`queued_by_tier`)."""
    services: Services = request.state.services
    name = request.path_params["model"]
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
