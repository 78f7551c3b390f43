"""Uploaded files (`/v1/files`): the Batch API's input files and the output files it writes.

A file is one Redis hash (its metadata and content), bounded by FILE_MAX_BYTES, with a
budget of FILES_BYTES_PER_KEY per API key, and expires FILE_RETENTION_SECONDS after its
upload (or at its `expires_after`). `FileStore` is what the routes and the batch driver need
of the storage: an object store would implement the same five methods. A `batch` file is
checked line by line on upload (api/batch_lines.py): a bad line is a 400 naming it, and
nothing is stored.
"""

from __future__ import annotations

import hmac
import secrets
import string
import time
from dataclasses import asdict, dataclass
from typing import Protocol

import redis.asyncio as aredis
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.auth import request_owner
from api.batch_lines import parse_lines
from api.endpoints import read_body
from api.errors import APIError, invalid
from api.owners import OwnerRate
from api.paging import page
from api.services import Services
from contract import errors, keys, scripts
from contract.entries import as_text

_ALPHABET = string.ascii_letters + string.digits
PURPOSES = ("batch", "batch_output")  # what is stored; only `batch` may be uploaded


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int

    def object(self) -> dict:
        """OpenAI's FileObject (`status` is deprecated there, and always `processed` here)."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


class FileQuota(Exception):
    """The owner's files would exceed FILES_BYTES_PER_KEY."""


@dataclass(frozen=True)
class UploadQuota:
    """What an upload is checked against, with its write in one step (0: no limit): the
    owner's bytes of files, and the per-minute request rate and byte budget its jobs share."""

    file_bytes: int = 0
    requests_per_minute: int = 0
    bytes_per_minute: int = 0


class FileStore(Protocol):
    async def put(self, record: FileRecord, content: bytes, quota: UploadQuota = UploadQuota()) -> None: ...
    async def get(self, file_id: str) -> FileRecord | None: ...
    async def content(self, file_id: str) -> bytes | None: ...
    async def delete(self, file_id: str) -> None: ...
    async def owned(self, owner: str) -> list[FileRecord]: ...


_FIELDS = ["owner", "filename", "purpose", "bytes", "created_at", "expires_at"]


class RedisFiles:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client
        self._store = client.register_script(scripts.STORE_FILE)

    async def put(self, record: FileRecord, content: bytes, quota: UploadQuota = UploadQuota()) -> None:
        """Store the file; FileQuota if its owner's files would exceed `quota.file_bytes`,
        OwnerRate if the upload is over its owner's request rate or byte budget this minute
        (an upload is a request of its size, like a job's). Checked and written in one step
        (contract.scripts.STORE_FILE): concurrent uploads cannot overshoot."""
        owner, minute = record.owner, int(time.time() // 60)
        key = keys.file(record.id)
        meta = {k: str(v) for k, v in asdict(record).items() if k != "id"}
        rated = bool(owner) and (quota.requests_per_minute or quota.bytes_per_minute)
        verdict = await self._store(
            keys=[
                key,
                keys.owned(owner, keys.Owned.FILES),
                keys.owned(owner, keys.Owned.FILE_SIZES),
                keys.requests_per_minute(owner, minute) if rated else key,
                keys.bytes_per_minute(owner, minute) if rated else key,
            ],
            args=[
                record.id,
                record.bytes,
                record.expires_at,
                record.created_at,
                quota.file_bytes,
                quota.requests_per_minute if rated else 0,
                quota.bytes_per_minute if rated else 0,
                *(x for pair in {**meta, "content": content}.items() for x in pair),
            ],
        )
        if verdict[0] == b"quota":
            raise FileQuota(owner)
        if verdict[0] == b"rate":
            raise OwnerRate(as_text(verdict[1]))

    async def get(self, file_id: str) -> FileRecord | None:
        values = await self._r.hmget(keys.file(file_id), _FIELDS)
        if values[0] is None:
            return None
        owner, filename, purpose, size, created, expires = (as_text(v) for v in values)
        return FileRecord(file_id, owner, filename, purpose, int(size), int(created), int(expires))

    async def content(self, file_id: str) -> bytes | None:
        return await self._r.hget(keys.file(file_id), "content")

    async def delete(self, file_id: str) -> None:
        owner = await self._r.hget(keys.file(file_id), "owner")
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file(file_id))
            if owner is not None:
                pipe.zrem(keys.owned(as_text(owner), keys.Owned.FILES), file_id)
                pipe.hdel(keys.owned(as_text(owner), keys.Owned.FILE_SIZES), file_id)
            await pipe.execute()

    async def owned(self, owner: str) -> list[FileRecord]:
        """The owner's files, oldest first (expired ones leave the index here)."""
        ids = [as_text(i) for i in await self._r.zrange(keys.owned(owner, keys.Owned.FILES), 0, -1)]
        out = []
        for file_id in ids:
            record = await self.get(file_id)
            if record is None:
                await self._r.zrem(keys.owned(owner, keys.Owned.FILES), file_id)
                await self._r.hdel(keys.owned(owner, keys.Owned.FILE_SIZES), file_id)
            else:
                out.append(record)
        return out


def files_of(services: Services) -> RedisFiles:
    return RedisFiles(services.redis)


async def file_of(request: Request, param: str = "file_id") -> tuple[Services, RedisFiles, FileRecord]:
    """The file named in the path if the caller's key owns it; else 404 (never 403)."""
    services: Services = request.state.services
    files = files_of(services)
    file_id = request.path_params["file_id"]
    record = await files.get(file_id) if file_id.startswith("file-") and len(file_id) <= 64 else None
    if record is None or not hmac.compare_digest(record.owner, request_owner(request)):
        raise APIError(errors.NOT_FOUND, "No file found with that id.", param=param)
    return services, files, record


async def _form(request: Request, limit: int, timeout_s: float):
    """The multipart form, from a body read within the request limits (413, 408)."""
    raw = await read_body(request, limit, timeout_s)

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    return await Request(request.scope, receive).form(max_files=1, max_fields=8)


async def upload(request: Request) -> Response:
    services: Services = request.state.services
    settings = services.settings
    services.admission.storage()
    form = await _form(request, settings.batches.file_max_bytes + 65536, settings.limits.request_read_s)
    purpose, upload_ = form.get("purpose"), form.get("file")
    if purpose is None:
        raise invalid(
            "Missing required parameter: 'purpose'.", param="purpose", error=errors.MISSING_PARAMETER
        )
    if purpose != "batch":
        raise invalid("Invalid 'purpose': this server stores 'batch' files only.", param="purpose")
    if not isinstance(upload_, UploadFile):
        raise invalid("Missing required parameter: 'file'.", param="file", error=errors.MISSING_PARAMETER)
    content = await upload_.read()
    if len(content) > settings.batches.file_max_bytes:
        raise APIError(
            errors.TOO_LARGE, f"The file exceeds the limit of {settings.batches.file_max_bytes} bytes."
        )
    if settings.quotas.key_bytes_per_minute and len(content) > settings.quotas.key_bytes_per_minute:
        raise APIError(  # a 429 would ask for a retry that can never succeed
            errors.TOO_LARGE,
            f"The file exceeds this key's budget of {settings.quotas.key_bytes_per_minute} bytes per minute.",
        )
    parse_lines(content, settings.limits, settings.batches.batch_max_lines)
    now = int(time.time())
    record = FileRecord(
        new_id("file-"),
        request_owner(request),
        (upload_.filename or "upload")[:255],
        purpose,
        len(content),
        now,
        now + _lifetime(form, settings.batches.file_retention_s),
    )
    quota = UploadQuota(
        settings.quotas.files_bytes_per_key,
        settings.quotas.key_requests_per_minute,
        settings.quotas.key_bytes_per_minute,
    )
    try:
        await files_of(services).put(record, content, quota)
    except FileQuota:
        raise APIError(
            errors.TOO_LARGE,
            f"This key's files would exceed {settings.quotas.files_bytes_per_key} bytes: delete some first.",
            param="file",
        ) from None
    except OwnerRate as exc:
        raise services.admission.rate(exc.what) from None
    return JSONResponse(record.object())


def _lifetime(form, retention_s: int) -> int:
    """Seconds the file lives: `expires_after[seconds]` (anchor created_at, at most the
    server's retention), else the retention."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return retention_s
    if anchor != "created_at" or not isinstance(seconds, str) or not seconds.isdigit():
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
    data = await files.content(record.id)
    if data is None:
        raise APIError(errors.NOT_FOUND, "No file found with that id.", param="file_id")
    return Response(data, media_type="application/octet-stream")


async def delete(request: Request) -> Response:
    _, files, record = await file_of(request)
    await files.delete(record.id)
    return JSONResponse({"id": record.id, "object": "file", "deleted": True})


async def list_files(request: Request) -> Response:
    services: Services = request.state.services
    records = await files_of(services).owned(request_owner(request))
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
