"""The Files API (`/v1/files`): the Batch API's input files, and the output files it writes.

It also holds images a request names by file id. The files are kept by api/files/store.py.

An upload is counted against its key's per-minute budgets before it is parsed. A `batch` file
is then checked line by line (api/batches/lines.py, off the event loop). A `vision` file is
checked as an image (api/endpoints/images.py). A bad one is a 400, and nothing is stored. A
`user_data` file is stored as it is.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Scope

from api.batches.lines import parse_lines
from api.endpoints import images
from api.files.store import FileLimits, FileQuota, FileRecord, RedisFiles, files_of, new_id, owned_file
from api.http.auth import request_grant, request_owner
from api.http.errors import APIError, invalid
from api.http.paging import page
from api.http.reading import read_body
from api.services import Services
from api.settings import Quotas
from contract import errors


async def file_of(request: Request, param: str = "file_id") -> tuple[Services, RedisFiles, FileRecord]:
    """The file named in the path, if the caller's key owns it. Else 404 (never 403)."""
    services: Services = request.state.services
    files = files_of(services.redis)
    record = await owned_file(files, request.path_params["file_id"], request_owner(request))
    if record is None:
        raise APIError(errors.NOT_FOUND, "No file found with that id.", param=param)
    return services, files, record


# the purposes a client may upload
UPLOADED = ("batch", "vision", "user_data")


@dataclass(frozen=True)
class _Form:
    # the text fields
    fields: dict[str, str]
    # the `file` part's, if it has one
    filename: str | None
    # the `file` part
    content: bytes | None


def _form(scope: Scope, raw: bytes) -> _Form:
    """The multipart form of a body already read. It runs in the heavy lane, in an event
    loop of its own there. A 20 MB body takes a tenth of a second to split."""

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def parse() -> _Form:
        form = await Request(scope, receive).form(max_files=1, max_fields=8)
        upload = form.get("file")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if not isinstance(upload, UploadFile):
            return _Form(fields, None, None)
        return _Form(fields, upload.filename, await upload.read())

    return asyncio.run(parse())


async def upload(request: Request) -> Response:
    services: Services = request.state.services
    settings = services.settings
    owner = request_owner(request)
    services.admission.storage()
    raw = await read_body(request, settings.batches.file_max_bytes + 65536, settings.limits.request_read_s)
    grant = request_grant(request)
    bytes_per_minute = services.admission.budgets(grant).bytes_per_minute
    if bytes_per_minute and len(raw) > bytes_per_minute:
        # a 429 would ask for a retry that can never succeed
        raise APIError(
            errors.TOO_LARGE,
            f"The file exceeds this key's budget of {bytes_per_minute} bytes per minute.",
        )
    # Counted before any parsing: a refused upload costs no more than its read.
    await services.admission.spend(owner, len(raw), grant)
    form = await services.heavy.run(_form, request.scope, raw)
    purpose, content = form.fields.get("purpose"), form.content
    if purpose is None:
        raise invalid(
            "Missing required parameter: 'purpose'.", param="purpose", error=errors.MISSING_PARAMETER
        )
    if purpose not in UPLOADED:
        raise invalid(
            f"Invalid 'purpose': this server stores {', '.join(map(repr, UPLOADED))} files.", param="purpose"
        )
    if content is None:
        raise invalid("Missing required parameter: 'file'.", param="file", error=errors.MISSING_PARAMETER)
    if len(content) > settings.batches.file_max_bytes:
        raise APIError(
            errors.TOO_LARGE, f"The file exceeds the limit of {settings.batches.file_max_bytes} bytes."
        )
    if purpose == "batch":
        await services.heavy.run(parse_lines, content, settings.limits, settings.batches.batch_max_lines)
    # an image a request may name by its id (Responses' input_image)
    elif purpose == "vision":
        images.checked(content, "file", settings.limits)
    now = int(time.time())
    record = FileRecord(
        new_id("file-"),
        owner,
        (form.filename or "upload")[:255],
        purpose,
        len(content),
        now,
        now + _lifetime(form.fields, settings.batches.file_retention_s),
    )
    await store(services, record, content)
    return JSONResponse(record.object())


async def store(services: Services, record: FileRecord, content: bytes) -> None:
    """Store a file within its owner's FILES_BYTES_PER_KEY and MAX_FILES_PER_KEY (413)."""
    quotas = services.settings.quotas
    try:
        limits = FileLimits(quotas.files_bytes_per_key, quotas.max_files_per_key)
        await files_of(services.redis).put(record, content, limits)
    except FileQuota as exc:
        raise over_quota(quotas, exc.what) from None


def over_quota(quotas: Quotas, what: str) -> APIError:
    """413: the owner holds too much (what a file, or a batch's lines, would add)."""
    if what == "files":
        return APIError(
            errors.TOO_LARGE,
            f"This key holds {quotas.max_files_per_key} files, the most allowed: delete some first.",
            param="file",
        )
    return APIError(
        errors.TOO_LARGE,
        f"This key's files and batches would hold more than {quotas.files_bytes_per_key} bytes: "
        "delete some files or wait for a batch to end.",
        param="file",
    )


def _lifetime(form: dict[str, str], retention_s: int) -> int:
    """Seconds the file lives: `expires_after[seconds]`, else the retention. Its anchor is
    created_at, and it is at most the server's retention."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return retention_s
    if anchor != "created_at" or seconds is None or not seconds.isdigit():
        raise invalid(
            "Invalid 'expires_after': anchor 'created_at' and a number of seconds.", "expires_after"
        )
    if not 3600 <= int(seconds) <= 2_592_000:
        raise invalid("Invalid 'expires_after.seconds': from 3600 to 2592000.", "expires_after.seconds")
    return min(int(seconds), retention_s)


async def retrieve(request: Request) -> Response:
    _, _, record = await file_of(request)
    return JSONResponse(record.object())


async def content(request: Request) -> Response:
    _, files, record = await file_of(request)
    return StreamingResponse(files.pieces(record.id, record.bytes), media_type="application/octet-stream")


async def delete(request: Request) -> Response:
    _, files, record = await file_of(request)
    await files.delete(record.id)
    return JSONResponse({"id": record.id, "object": "file", "deleted": True})


async def list_files(request: Request) -> Response:
    services: Services = request.state.services
    records = await files_of(services.redis).owned(request_owner(request))
    if purpose := request.query_params.get("purpose"):
        records = [r for r in records if r.purpose == purpose]
    return page(request, [r.object() for r in records], max_limit=10_000, default_limit=10_000)


ROUTES = [
    Route("/v1/files", upload, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", retrieve, methods=["GET"]),
    Route("/v1/files/{file_id}", delete, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", content, methods=["GET"]),
]
