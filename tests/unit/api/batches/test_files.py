"""api/batches/files.py: the Files API's handlers on fakeredis (real Lua), called with multipart
bodies: what an upload stores and refuses (purpose, size, budgets, quotas, `expires_after`),
and that a file is only ever its own key's to read, list or delete."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import fakeredis
import pytest
from starlette.requests import Request
from starlette.responses import Response

from api.batches import files
from api.files.store import FILE_ID
from api.http.errors import APIError
from api.http.offload import Lane
from api.jobs.admission import Admission, OpenStreams
from api.jobs.memory import MemoryWatch
from api.jobs.workers import WorkerRegistry
from api.pool_settings import Batches
from api.settings import Quotas, Settings
from contract import keys
from contract.media.images import png
from contract.servers import Servers

BOUNDARY = "tokenspool-test-boundary"
LINE = json.dumps(
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
)


def services(settings: Settings | None = None) -> SimpleNamespace:
    """What the handlers read of Services, with a real Admission on one fakeredis."""
    settings = settings or Settings()
    r = fakeredis.FakeAsyncRedis()
    memory = MemoryWatch(Servers(r, r), settings.intake.redis_memory_high)
    admission = Admission(r, WorkerRegistry(r, 15), OpenStreams(), memory, settings.intake, settings.quotas)
    return SimpleNamespace(settings=settings, redis=r, admission=admission, heavy=Lane(), memory=memory)


def multipart(fields: dict[str, str], file: tuple[str, bytes] | None = None) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    if file is not None:
        filename, content = file
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        parts.append(f"{head}Content-Type: application/octet-stream\r\n\r\n".encode() + content + b"\r\n")
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def call(
    handler,
    s: SimpleNamespace,
    owner: str = "alice",
    body: bytes = b"",
    file_id: str | None = None,
    query: str = "",
) -> Response:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()))
    scope = {
        "type": "http",
        "method": "POST" if body else "GET",
        "path": "/v1/files",
        "headers": headers,
        "query_string": query.encode(),
        "state": {"services": s, "owner": owner},
        "path_params": {} if file_id is None else {"file_id": file_id},
    }
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    return asyncio.run(handler(Request(scope, receive)))


def upload(s: SimpleNamespace, purpose: str | None, content: bytes | None, owner: str = "alice", **fields):
    filename = fields.pop("filename", "input.jsonl")
    form = {**({} if purpose is None else {"purpose": purpose}), **fields}
    body = multipart(form, None if content is None else (filename, content))
    return json.loads(call(files.upload, s, owner, body).body)


def refusal(fn, *args, **kwargs) -> APIError:
    with pytest.raises(APIError) as caught:
        fn(*args, **kwargs)
    return caught.value


def content_of(s: SimpleNamespace, file_id: str, owner: str = "alice") -> bytes:
    response = call(files.content, s, owner, file_id=file_id)

    async def read() -> bytes:
        return b"".join([piece async for piece in response.body_iterator])

    return asyncio.run(read())


def stored_files(s: SimpleNamespace) -> list[bytes]:
    return asyncio.run(s.redis.keys(keys.file("*")))


def test_an_uploaded_file_is_stored_as_it_was_sent_and_described_as_openai_does():
    s = services()
    data = b"\x00\xffnot text at all\r\n"
    obj = upload(s, "user_data", data)
    assert FILE_ID.fullmatch(obj["id"])
    assert {k: v for k, v in obj.items() if k not in ("id", "created_at", "expires_at")} == {
        "object": "file",
        "bytes": len(data),
        "filename": "input.jsonl",
        "purpose": "user_data",
        "status": "processed",
        "status_details": None,
    }
    assert obj["expires_at"] - obj["created_at"] == Batches().file_retention_s
    assert json.loads(call(files.retrieve, s, file_id=obj["id"]).body) == obj
    assert content_of(s, obj["id"]) == data


def test_a_long_filename_is_cut_to_255_characters():
    assert upload(services(), "user_data", b"x", filename="n" * 300)["filename"] == "n" * 255


def test_another_key_s_file_is_not_found_never_forbidden():
    s = services()
    file_id = upload(s, "user_data", b"mine")["id"]
    for handler in (files.retrieve, files.content, files.delete):
        error = refusal(call, handler, s, "bob", file_id=file_id)
        assert (error.status, error.param) == (404, "file_id")
    assert refusal(call, files.retrieve, s, "alice", file_id="../../etc").status == 404
    assert content_of(s, file_id) == b"mine"  # bob's delete took nothing


def test_a_deleted_file_is_gone_from_its_owner_s_list_and_store():
    s = services()
    kept, gone = upload(s, "user_data", b"a")["id"], upload(s, "user_data", b"b")["id"]
    assert json.loads(call(files.delete, s, file_id=gone).body) == {
        "id": gone,
        "object": "file",
        "deleted": True,
    }
    assert refusal(call, files.retrieve, s, file_id=gone).status == 404
    assert [f["id"] for f in json.loads(call(files.list_files, s).body)["data"]] == [kept]


def test_a_key_lists_its_own_files_newest_first_and_by_purpose(monkeypatch):
    s = services()
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    batch = upload(s, "batch", LINE.encode())["id"]
    monkeypatch.setattr(time, "time", lambda: now + 5)  # created seconds apart: the order is known
    data = upload(s, "user_data", b"x")["id"]
    upload(s, "user_data", b"y", owner="bob")
    listed = json.loads(call(files.list_files, s).body)
    assert [f["id"] for f in listed["data"]] == [data, batch] and listed["has_more"] is False
    only = json.loads(call(files.list_files, s, query="purpose=batch").body)["data"]
    assert [f["id"] for f in only] == [batch]


def test_a_batch_file_with_a_bad_line_is_refused_and_nothing_is_stored():
    s = services()
    error = refusal(upload, s, "batch", f"{LINE}\n{{not json\n".encode())
    assert (error.status, error.param) == (400, "file") and "Line 2" in error.message
    assert stored_files(s) == []


def test_a_vision_file_must_be_an_image():
    s = services()
    assert upload(s, "vision", png(4, 3), filename="a.png")["purpose"] == "vision"
    error = refusal(upload, s, "vision", b"GIF? no", filename="b.gif")
    assert (error.status, error.param) == (400, "file") and "not a PNG, JPEG, WebP or GIF" in error.message
    assert len(stored_files(s)) == 2  # the image's record and content: the bad one left nothing


@pytest.mark.parametrize(
    ("purpose", "content", "code", "param"),
    [
        (None, b"x", "missing_required_parameter", "purpose"),
        ("batch_output", b"x", "invalid_value", "purpose"),  # written by a batch, never uploaded
        ("fine-tune", b"x", "invalid_value", "purpose"),
        ("user_data", None, "missing_required_parameter", "file"),
    ],
)
def test_an_upload_needs_an_uploadable_purpose_and_a_file(purpose, content, code, param):
    s = services()
    error = refusal(upload, s, purpose, content)
    assert (error.status, error.code, error.param) == (400, code, param)
    assert stored_files(s) == []


def test_a_file_over_file_max_bytes_is_too_large():
    s = services(Settings(batches=Batches(file_max_bytes=10)))
    assert upload(s, "user_data", b"0123456789")["bytes"] == 10
    error = refusal(upload, s, "user_data", b"0123456789A")
    assert (error.status, error.message) == (413, "The file exceeds the limit of 10 bytes.")


def test_an_upload_larger_than_the_key_s_bytes_per_minute_is_413_and_counts_nothing():
    s = services(Settings(quotas=Quotas(key_bytes_per_minute=1000)))
    error = refusal(upload, s, "user_data", b"x" * 1000)  # with its form's parts, past the budget
    assert error.status == 413 and "budget of 1000 bytes per minute" in error.message  # a retry never fits
    assert asyncio.run(s.redis.keys("*")) == []
    assert upload(s, "user_data", b"x")["bytes"] == 1


def test_an_upload_is_counted_against_the_request_budget_before_it_is_parsed():
    s = services(Settings(quotas=Quotas(key_requests_per_minute=1)))
    assert refusal(upload, s, "nonsense", b"x").status == 400  # counted, though refused
    error = refusal(upload, s, "user_data", b"x")
    assert (error.status, error.code) == (429, "rate_limit_exceeded")


def test_redis_nearly_full_refuses_an_upload_with_retry_after():
    s = services()
    s.memory.used, s.memory.maxmemory = 99, 100
    error = refusal(upload, s, "user_data", b"x")
    assert (error.status, error.code) == (503, "storage_full") and "Retry-After" in error.headers
    assert asyncio.run(s.redis.keys("*")) == []


def expires_after(seconds: str | None, anchor: str | None = "created_at") -> dict[str, str]:
    fields = {} if anchor is None else {"expires_after[anchor]": anchor}
    return fields if seconds is None else {**fields, "expires_after[seconds]": seconds}


@pytest.mark.parametrize(
    ("seconds", "retention", "lifetime"),
    [("7200", 86400, 7200), ("3600", 86400, 3600), ("2592000", 86400, 86400), ("86400", 3600, 3600)],
)
def test_expires_after_sets_the_lifetime_within_the_retention(seconds, retention, lifetime):
    s = services(Settings(batches=Batches(file_retention_s=retention)))
    obj = upload(s, "user_data", b"x", **expires_after(seconds))
    assert obj["expires_at"] - obj["created_at"] == lifetime


@pytest.mark.parametrize(
    ("seconds", "anchor", "param"),
    [
        ("7200", "last_active_at", "expires_after"),
        ("7200", None, "expires_after"),
        (None, "created_at", "expires_after"),
        ("-7200", "created_at", "expires_after"),
        ("3599", "created_at", "expires_after.seconds"),
        ("2592001", "created_at", "expires_after.seconds"),
    ],
)
def test_a_bad_expires_after_is_refused_naming_its_part(seconds, anchor, param):
    s = services()
    error = refusal(upload, s, "user_data", b"x", **expires_after(seconds, anchor))
    assert (error.status, error.param) == (400, param)
    assert stored_files(s) == []


def test_a_key_holding_its_most_files_is_refused_until_it_deletes_one():
    s = services(Settings(quotas=Quotas(max_files_per_key=1)))
    first = upload(s, "user_data", b"a")["id"]
    error = refusal(upload, s, "user_data", b"b")
    assert (error.status, error.param) == (413, "file") and "holds 1 files" in error.message
    assert upload(s, "user_data", b"b", owner="bob")["bytes"] == 1  # another key's own count
    call(files.delete, s, file_id=first)
    assert upload(s, "user_data", b"b")["bytes"] == 1


def test_a_key_over_its_stored_bytes_is_refused():
    s = services(Settings(quotas=Quotas(files_bytes_per_key=10)))
    upload(s, "user_data", b"123456")
    error = refusal(upload, s, "user_data", b"12345")
    assert (error.status, error.param) == (413, "file") and "more than 10 bytes" in error.message
    assert upload(s, "user_data", b"1234")["bytes"] == 4  # exactly the budget


def test_over_quota_names_what_the_key_holds_too_much_of():
    quotas = Quotas(max_files_per_key=7, files_bytes_per_key=900)
    assert files.over_quota(quotas, "files").message == (
        "This key holds 7 files, the most allowed: delete some first."
    )
    bytes_error = files.over_quota(quotas, "bytes")
    assert bytes_error.status == 413 and "more than 900 bytes" in bytes_error.message
