"""The Files store: an uploaded file is a Redis hash (its metadata) and a string (its content).

A file is bounded by FILE_MAX_BYTES. It is charged to its key's FILES_BYTES_PER_KEY and
MAX_FILES_PER_KEY (contract/lua/accounting.py). It expires FILE_RETENTION_SECONDS after its
upload, or at its `expires_after`. `FileStore` is what the Files routes, the Batch API and
the image readers need of the storage. An object store would implement the same methods."""

from __future__ import annotations

import hmac
import re
import secrets
import string
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Protocol

import redis.asyncio as aredis

from contract import keys
from contract.entries import as_text
from contract.lua import accounting

_ALPHABET = string.ascii_letters + string.digits
# batch_output: written by a batch only
PURPOSES = ("batch", "batch_output", "vision", "user_data")


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
        """OpenAI's FileObject. `status` is deprecated there, and always `processed` here."""
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
        # "bytes" or "files"
        self.what = what


@dataclass(frozen=True)
class FileLimits:
    """What the owner may hold, checked with a file's write in one step (0: no limit)."""

    bytes: int = 0
    files: int = 0


# an output file: the work is done, so it is stored and charged anyway
UNLIMITED = FileLimits()


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
# a file's content is read back a MiB at a time
PIECE = 1 << 20


class RedisFiles:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client
        self._store = client.register_script(accounting.STORE_FILE)
        self._delete = client.register_script(accounting.DELETE_FILE)

    async def put(self, record: FileRecord, content: bytes, limits: FileLimits) -> None:
        """Store the file. FileQuota if its owner would then hold more than `limits` allow.
        It is checked and written in one step (contract/lua/accounting.py), so concurrent
        uploads cannot overshoot."""
        await self._write(record, limits, content)

    async def append(self, file_id: str, piece: bytes) -> None:
        """Add to the content of a file being written. That is an output file, `seal`ed at the end."""
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
        """The content a MiB at a time. A file is never read whole into memory to be sent."""
        if await self._r.exists(keys.file_content(file_id)):
            for start in range(0, size, PIECE):
                yield await self._r.getrange(keys.file_content(file_id), start, start + PIECE - 1)
        # stored before the content had a key of its own
        else:
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
        """The owner's files, oldest first. There are at most MAX_FILES_PER_KEY of them: one round trip."""
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


def files_of(client: aredis.Redis) -> RedisFiles:
    return RedisFiles(client)


async def owned_file(files: FileStore, file_id: str, owner: str) -> FileRecord | None:
    """The file `file_id`, if `owner` holds it. None: no such file, or another key's."""
    record = await files.get(file_id) if FILE_ID.fullmatch(file_id) else None
    if record is None or not hmac.compare_digest(record.owner, owner):
        return None
    return record
