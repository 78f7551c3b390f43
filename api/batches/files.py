"""Uploaded files (`/v1/files`): the Batch API's input files and the output files it writes.

A file is a Redis hash (its metadata) and a string (its content), bounded by FILE_MAX_BYTES,
charged to its key's FILES_BYTES_PER_KEY and MAX_FILES_PER_KEY (contract/lua/accounting.py), and
expires FILE_RETENTION_SECONDS after its upload (or at its `expires_after`). `FileStore` is
what the routes and the batch driver need of the storage: an object store would implement
the same methods. An upload is counted against its key's per-minute budgets before it is
parsed; a `batch` file is then checked line by line (api/batches/lines.py, off the event
loop): a bad line is a 400 naming it, and nothing is stored.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import string
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Protocol

import redis.asyncio as aredis
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Scope

from api.batches.lines import parse_lines
from api.http.auth import request_grant, request_owner
from api.http.errors import APIError, invalid
from api.http.paging import page
from api.http.reading import read_body
from api.services import Services
from api.settings import Quotas
from contract import errors, keys
from contract.entries import as_text
from contract.lua import accounting

_ALPHABET = string.ascii_letters + string.digits
PURPOSES = ("batch", "batch_output")  # what is stored; only `batch` may be uploaded


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(24))


FILE_ID = re.compile(r"file-[A-Za-z0-9]{1,60}")
"""What a file id may be (checked before it names a key: a path is the client's own text)."""


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
    """The owner would hold more than FILES_BYTES_PER_KEY, or MAX_FILES_PER_KEY files."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what  # "bytes" or "files"


@dataclass(frozen=True)
class FileLimits:
    """What the owner may hold, checked with a file's write in one step (0: no limit)."""

    bytes: int = 0
    files: int = 0


UNLIMITED = FileLimits()  # an output file: the work is done, so it is stored and charged anyway


class FileStore(Protocol):
    async def put(self, record: FileRecord, content: bytes, limits: FileLimits) -> None: ...
    async def append(self, file_id: str, piece: bytes) -> None: ...
    async def seal(self, record: FileRecord) -> None: ...
    async def get(self, file_id: str) -> FileRecord | None: ...
    async def content(self, file_id: str) -> bytes | None: ...
    def pieces(self, file_id: str, size: int) -> AsyncIterator[bytes]: ...
    async def delete(self, file_id: str) -> None: ...
    async def owned(self, owner: str) -> list[FileRecord]: ...


_FIELDS = ["owner", "filename", "purpose", "bytes", "created_at", "expires_at"]
PIECE = 1 << 20  # a file's content is read back a MiB at a time


class RedisFiles:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client
        self._store = client.register_script(accounting.STORE_FILE)
        self._delete = client.register_script(accounting.DELETE_FILE)

    async def put(self, record: FileRecord, content: bytes, limits: FileLimits) -> None:
        """Store the file; FileQuota if its owner would then hold more than `limits` allow.
        Checked and written in one step (contract/lua/accounting.py): concurrent uploads cannot
        overshoot."""
        await self._write(record, limits, content)

    async def append(self, file_id: str, piece: bytes) -> None:
        """Add to the content of a file being written (an output file, `seal`ed at the end)."""
        await self._r.append(keys.file_content(file_id), piece)

    async def seal(self, record: FileRecord) -> None:
        """Store the file whose content was appended, charged to its owner whatever it holds."""
        await self._write(record, UNLIMITED, None)

    async def _write(self, record: FileRecord, limits: FileLimits, content: bytes | None) -> None:
        meta = {k: str(v) for k, v in asdict(record).items() if k != "id"}
        verdict = await self._store(
            keys=[keys.file(record.id), keys.file_content(record.id), *accounting.charge_keys(record.owner)],
            args=[
                record.id,
                record.bytes,
                record.expires_at,
                record.created_at,
                limits.bytes,
                limits.files,
                "0" if content is None else "1",
                *(x for pair in meta.items() for x in pair),
                *(() if content is None else (content,)),
            ],
        )
        if verdict[0] != b"new":
            raise FileQuota("bytes" if verdict[0] == b"quota" else "files")

    async def get(self, file_id: str) -> FileRecord | None:
        return _record(file_id, await self._r.hmget(keys.file(file_id), _FIELDS))

    async def content(self, file_id: str) -> bytes | None:
        data = await self._r.get(keys.file_content(file_id))
        return data if data is not None else await self._r.hget(keys.file(file_id), "content")

    async def pieces(self, file_id: str, size: int) -> AsyncIterator[bytes]:
        """The content a MiB at a time (a file is never read whole into memory to be sent)."""
        if await self._r.exists(keys.file_content(file_id)):
            for start in range(0, size, PIECE):
                yield await self._r.getrange(keys.file_content(file_id), start, start + PIECE - 1)
        else:  # stored before the content had a key of its own
            yield await self._r.hget(keys.file(file_id), "content") or b""

    async def delete(self, file_id: str) -> None:
        owner = await self._r.hget(keys.file(file_id), "owner")
        if owner is not None:
            await self._delete(
                keys=[
                    keys.file(file_id),
                    keys.file_content(file_id),
                    *accounting.charge_keys(as_text(owner)),
                ],
                args=[file_id],
            )

    async def owned(self, owner: str) -> list[FileRecord]:
        """The owner's files, oldest first (at most MAX_FILES_PER_KEY of them: one round trip)."""
        index = keys.owned(owner, keys.OwnerIndex.FILES)
        ids = [as_text(i) for i in await self._r.zrange(index, 0, -1)]
        async with self._r.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hmget(keys.file(file_id), _FIELDS)
            rows = await pipe.execute()
        # an expired file leaves the index with the owner's next charge (contract/lua/accounting.py)
        return [r for i, values in zip(ids, rows, strict=True) if (r := _record(i, values)) is not None]


def _record(file_id: str, values: list) -> FileRecord | None:
    """A file's record from its hash's `_FIELDS` (None: no such file)."""
    if values[0] is None:
        return None
    owner, filename, purpose, size, created, expires = (as_text(v) for v in values)
    return FileRecord(file_id, owner, filename, purpose, int(size), int(created), int(expires))


def files_of(services: Services) -> RedisFiles:
    return RedisFiles(services.redis)


async def file_of(request: Request, param: str = "file_id") -> tuple[Services, RedisFiles, FileRecord]:
    """The file named in the path if the caller's key owns it; else 404 (never 403)."""
    services: Services = request.state.services
    files = files_of(services)
    file_id = request.path_params["file_id"]
    record = await files.get(file_id) if FILE_ID.fullmatch(file_id) else None
    if record is None or not hmac.compare_digest(record.owner, request_owner(request)):
        raise APIError(errors.NOT_FOUND, "No file found with that id.", param=param)
    return services, files, record


@dataclass(frozen=True)
class _Form:
    fields: dict[str, str]  # the text fields
    filename: str | None  # the `file` part's, if it has one
    content: bytes | None  # the `file` part


def _form(scope: Scope, raw: bytes) -> _Form:
    """The multipart form of a body already read (run in the heavy lane: a 20 MB body takes
    a tenth of a second to split, in an event loop of its own there)."""

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
        raise APIError(  # a 429 would ask for a retry that can never succeed
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
    if purpose != "batch":
        raise invalid("Invalid 'purpose': this server stores 'batch' files only.", param="purpose")
    if content is None:
        raise invalid("Missing required parameter: 'file'.", param="file", error=errors.MISSING_PARAMETER)
    if len(content) > settings.batches.file_max_bytes:
        raise APIError(
            errors.TOO_LARGE, f"The file exceeds the limit of {settings.batches.file_max_bytes} bytes."
        )
    await services.heavy.run(parse_lines, content, settings.limits, settings.batches.batch_max_lines)
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
        await files_of(services).put(record, content, limits)
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
    """Seconds the file lives: `expires_after[seconds]` (anchor created_at, at most the
    server's retention), else the retention."""
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
