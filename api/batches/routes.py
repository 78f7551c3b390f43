"""The Batch API (`/v1/batches`): an input file's lines, each run as an ordinary job.

Each line runs as a job of the endpoint it names, at `batch` tier. It is answered once, in
the batch's output or error file.

A batch is one Redis hash plus its lines (a list), its open lines and its results. The open
lines map each line to the job running it. The results map each line to its output line,
each written once. `api/batches/driver.py` sends lines as jobs a few at a time, collects
their answers and writes the files. Statuses are OpenAI's: validating, in_progress,
finalizing, completed, failed, expired, cancelling, cancelled.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.batches.files import over_quota
from api.batches.lines import parse_lines
from api.files.store import files_of, new_id, owned_file
from api.http.auth import allowed, request_grant, request_owner
from api.http.errors import APIError, invalid
from api.http.paging import page
from api.http.parsing import parse
from api.http.reading import read_json
from api.services import Services
from contract import errors, keys, tiers
from contract.entries import as_text
from contract.lua import accounting

# "24h", the one completion window
WINDOW_S = 86400
# a batch counted as running this long has long ended
STALE_RUNNING_MS = 2 * WINDOW_S * 1000
# a running batch's charges outlive its window by this, should its driver stall
CHARGE_MARGIN_S = 86400


class BatchStatus(StrEnum):
    """A batch's status, as OpenAI names them (its hash holds these strings)."""

    # created; the driver has not taken it up yet
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    # its files are being written (`ending` says how it ends)
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ENDED = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
_TIMES = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


class BatchRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank"]
    completion_window: Literal["24h"]
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None


def batch_object(batch_id: str, h: dict[str, str]) -> dict:
    """OpenAI's Batch object from the batch's hash: every key, `null` where unset."""
    counts = {k: int(h.get(k, 0)) for k in ("total", "completed", "failed")}
    tokens_in, tokens_out = int(h.get("input_tokens", 0)), int(h.get("output_tokens", 0))
    return {
        "id": batch_id,
        "object": "batch",
        "endpoint": h["endpoint"],
        "errors": _errors(h),
        "input_file_id": h["input_file_id"],
        "completion_window": "24h",
        "status": h["status"],
        "output_file_id": h.get("output_file_id"),
        "error_file_id": h.get("error_file_id"),
        **{t: int(h[t]) if t in h else None for t in _TIMES},
        "request_counts": counts,
        "metadata": json.loads(h.get("metadata", "{}")),
        "model": h.get("model"),
        "usage": {
            "input_tokens": tokens_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens_in + tokens_out,
        },
    }


def _errors(h: dict[str, str]) -> dict | None:
    """Why a batch failed as a whole. Its driver could not run it, or its key held too much."""
    if not h.get("failure"):
        return None
    error = {"code": errors.BATCH_FAILED.code, "message": h["failure"], "param": None, "line": None}
    return {"object": "list", "data": [error]}


async def batch_hash(services: Services, batch_id: str) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in (await services.redis.hgetall(keys.batch(batch_id))).items()}


BATCH_ID = re.compile(r"batch_[A-Za-z0-9]{1,60}")
"""What a batch id may be (checked before it names a key: a path is the client's own text)."""


async def _batch_of(request: Request) -> tuple[Services, str, dict[str, str]]:
    """The batch named in the path, if the caller's key owns it. Else 404 (never 403)."""
    services: Services = request.state.services
    batch_id = request.path_params["batch_id"]
    h = await batch_hash(services, batch_id) if BATCH_ID.fullmatch(batch_id) else {}
    if not h or not hmac.compare_digest(h["owner"], request_owner(request)):
        raise APIError(errors.NOT_FOUND, "No batch found with that id.", param="batch_id")
    return services, batch_id, h


async def create(request: Request) -> Response:
    services: Services = request.state.services
    settings = services.settings
    services.admission.storage()
    body = parse(
        BatchRequest, await read_json(request, settings.limits.max_body_bytes, settings.limits.request_read_s)
    )
    owner = request_owner(request)
    # a batch's lines wait in the batch tier
    allowed(request_grant(request), tiers.BATCH)
    files = files_of(services.redis)
    record = await owned_file(files, body.input_file_id, owner)
    if record is None or record.purpose != "batch":
        raise APIError(errors.NOT_FOUND, "No batch input file found with that id.", param="input_file_id")
    # The file is read and checked again: a request of its size against the key's budgets.
    await services.admission.spend(owner, record.bytes, request_grant(request))
    content = await files.content(record.id) or b""
    lines = await services.heavy.run(parse_lines, content, settings.limits, settings.batches.batch_max_lines)
    for line in lines:
        if line.url != body.endpoint:
            raise invalid(f"Line {line.number}: url {line.url} is not the batch's endpoint.", "input_file_id")
    models = sorted({line.body["model"] for line in lines})
    pools = {line.pool: line.body["model"] for line in lines}
    served = await services.admission.models(sorted(pools))
    if missing := [m for p, m in sorted(pools.items()) if p not in served]:
        raise APIError(errors.MODEL_NOT_FOUND, f"The model '{missing[0][:80]}' does not exist.", "model")
    batch_id, now = new_id("batch_"), int(time.time())
    fields = {
        "owner": owner,
        "endpoint": body.endpoint,
        "input_file_id": record.id,
        "status": BatchStatus.VALIDATING,
        "created_at": now,
        "expires_at": now + WINDOW_S,
        "total": len(lines),
        "metadata": json.dumps(body.metadata or {}),
        "next": 0,
    }
    if len(models) == 1:
        fields["model"] = models[0]
    rows = [json.dumps([ln.custom_id, ln.body], ensure_ascii=False, separators=(",", ":")) for ln in lines]
    created = await services.redis.register_script(accounting.CREATE_BATCH)(
        keys=[
            keys.batch(batch_id),
            keys.batch(batch_id, keys.BatchPart.LINES),
            keys.owned(owner, keys.OwnerIndex.BATCHES),
            keys.ACTIVE_BATCHES,
            keys.owned(owner, keys.OwnerIndex.RUNNING_BATCHES),
            *accounting.charge_keys(owner),
        ],
        args=[
            batch_id,
            int(time.time() * 1000),
            settings.quotas.max_batches_per_key,
            STALE_RUNNING_MS,
            settings.quotas.files_bytes_per_key,
            accounting.lines_charge(batch_id),
            # the copy it keeps while it runs
            sum(len(row.encode()) for row in rows),
            now + WINDOW_S + CHARGE_MARGIN_S,
            len(rows),
            *rows,
            *(str(x) for pair in fields.items() for x in pair),
        ],
    )
    if created[0] == b"quota":
        raise over_quota(settings.quotas, "bytes")
    if created[0] != b"new":
        raise APIError(
            errors.TOO_MANY_JOBS,
            f"This key has {int(created[1])} batches running (the limit is "
            f"{settings.quotas.max_batches_per_key}); wait for one to end.",
            headers={"Retry-After": str(settings.intake.retry_after_s)},
        )
    services.metrics.created.labels("batches").inc()
    return JSONResponse(batch_object(batch_id, {k: str(v) for k, v in fields.items()}))


async def retrieve(request: Request) -> Response:
    _, batch_id, h = await _batch_of(request)
    return JSONResponse(batch_object(batch_id, h))


async def cancel(request: Request) -> Response:
    """A running batch becomes `cancelling`, and its lines not yet answered are cancelled.
    Then it is `cancelled`, with the answers it had in its output file. Cancelling again
    changes nothing. An ended batch cannot be cancelled."""
    services, batch_id, h = await _batch_of(request)
    changed = await set_status(
        services,
        batch_id,
        (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS),
        {"status": BatchStatus.CANCELLING, "cancelling_at": int(time.time())},
    )
    h = await batch_hash(services, batch_id)
    if not changed and h["status"] not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise invalid(f"Cannot cancel a batch with status {h['status']}.", param="batch_id")
    return JSONResponse(batch_object(batch_id, h))


async def set_status(services: Services, batch_id: str, since: tuple[str, ...], fields: dict) -> bool:
    """Change the batch's status (and `fields`) only if it is one of `since` now. So a cancel
    and the driver, on any replicas, never undo each other's change (contract/lua/accounting.py)."""
    flat = [str(x) for pair in fields.items() for x in pair]
    done = await services.redis.register_script(accounting.SET_STATUS)(
        keys=[keys.batch(batch_id)], args=[" ".join(since), *flat]
    )
    return done == 1


async def list_batches(request: Request) -> Response:
    services: Services = request.state.services
    ids = [
        as_text(i)
        for i in await services.redis.zrange(
            keys.owned(request_owner(request), keys.OwnerIndex.BATCHES), 0, -1
        )
    ]
    objects = []
    for batch_id in ids:
        h = await batch_hash(services, batch_id)
        if h:
            objects.append(batch_object(batch_id, h))
        else:
            await services.redis.zrem(keys.owned(request_owner(request), keys.OwnerIndex.BATCHES), batch_id)
    return page(request, objects, max_limit=100, default_limit=20, order=False)


ROUTES = [
    Route("/v1/batches", create, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", retrieve, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel, methods=["POST"]),
]
