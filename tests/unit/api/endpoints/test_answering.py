"""api/endpoints/answering.py: a job's SSE stream and its whole answer, on fakeredis through the
real job store and relay: every stream ends with its ending whatever happened, a client gone
cancels its job (unless another attached since), and a job's end settles its owner's tokens."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from api.endpoints import answering
from api.endpoints.answering import SSEStream, cancel_quietly, collect, respond, settle
from api.endpoints.chat.events import ChunkEvents, chunk_events
from api.endpoints.chat.objects import ChatChunks
from api.endpoints.completions.objects import TextChunks
from api.endpoints.embeddings.objects import EmbeddingObjects
from api.endpoints.protocol import Answer
from api.http.errors import APIError
from api.http.offload import Lane
from api.jobs.admission import OpenStreams
from api.jobs.owners import now_ms, this_minute
from api.jobs.store import JobStore
from api.metrics import Metrics, StreamTiming
from api.pool_settings import Lifetimes
from api.settings import Settings
from api.streaming import sse
from api.streaming.reader import StreamReader
from api.streaming.relay import KEEPALIVE, StreamLost
from contract import entries, errors, keys
from contract.entries import Delta, Failed, Finished, Started
from contract.keys import JobField, JobStatus
from contract.settings import Recovery
from tests.fake_servers import FakePair

CID = "cmpl-answering"
OWNER = "owner-1"


def write(pair: FakePair, entry_id: str, entry) -> None:
    pair.sync().streams.xadd(keys.events(CID), entries.encode(entry), id=entry_id)


def job(pair: FakePair, status: str, *rows) -> None:
    """The job's hash in `status`, and its stream's entries."""
    ended = status in JobStatus.ENDED
    pair.sync().streams.hset(keys.job(CID), mapping={JobField.STATUS: status, JobField.ENDED: int(ended)})
    for entry_id, entry in rows:
        write(pair, entry_id, entry)


HELLO = (
    ("1-0", Started(epoch=1, worker="w1", prompt_tokens=3)),
    ("2-0", Delta(epoch=1, text="Hel", token_ids=(1,))),
    ("3-0", Delta(epoch=1, text="lo", token_ids=(2,))),
)
DONE = ("4-0", Finished(epoch=1, finish_reason="stop", prompt_tokens=3, completion_tokens=2))


def services(pair: FakePair, **lifetimes) -> SimpleNamespace:
    """What the answering code uses of `Services`, on the fake servers; its stream reader is
    never started, so the relay reads the job's stream itself (XRANGE) each time it looks."""
    aio = pair.aio()
    return SimpleNamespace(
        settings=Settings(lifetimes=Lifetimes(**lifetimes)),
        jobs=JobStore(aio, pair.sync(), queue_wait_s=60, recovery=Recovery()),
        reader=StreamReader("redis://fake", aio.streams),
        metrics=Metrics(),
        resumes=None,
        heavy=Lane(),
        streams=OpenStreams(),
    )


def stream(
    s, chunks, *, cancel: bool = True, arrived_ms: int = 0, settles: str = "", events=None
) -> SSEStream:
    return SSEStream(
        s,
        events or chunk_events(chunks, None),
        CID,
        s.streams.take(OWNER),
        StreamTiming(s.metrics, "m", arrived=None),
        cancel_on_disconnect=cancel,
        arrived_ms=arrived_ms,
        settles=settles,
    )


async def whole(body) -> bytes:
    return b"".join([piece async for piece in body])


def events_of(raw: bytes) -> list[Any]:
    """The data of each event (the JSON, or "[DONE]")."""
    out: list[Any] = []
    for event in raw.split(b"\n\n")[:-1]:
        data = [line[6:] for line in event.split(b"\n") if line.startswith(b"data: ")]
        if data:
            out.append("[DONE]" if data[0] == b"[DONE]" else json.loads(data[0]))
    return out


def reserve(pair: FakePair, reserved: int, prompt: int) -> str:
    """An owner's reservation for the job, as ADMIT leaves it; returns the minute's count key."""
    minute = this_minute()
    r = pair.sync().queues
    r.hset(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), CID, f"{minute} {reserved} {prompt}")
    counted = keys.tokens_per_minute(OWNER, minute)
    r.set(counted, reserved)
    return counted


def http_request(disconnected: bool = False) -> Request:
    async def receive() -> dict:
        return {"type": "http.disconnect"} if disconnected else {"type": "http.request", "body": b""}

    return Request(
        {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, receive
    )


def test_a_finished_jobs_stream_is_its_chunks_then_done_and_gives_its_place_back():
    pair = FakePair()
    job(pair, JobStatus.DONE, *HELLO, DONE)

    async def go() -> tuple[bytes, int, float | None]:
        s = services(pair)
        raw = await whole(stream(s, TextChunks(CID, 1, "m"))._body())
        return raw, s.streams.count(OWNER), s.metrics.registry.get_sample_value("tokenspool_streams_open")

    raw, still_open, gauge = asyncio.run(go())
    got = events_of(raw)
    assert [e["choices"][0]["text"] for e in got[:-2]] == ["Hel", "lo"]
    assert got[-2]["choices"][0]["finish_reason"] == "stop"
    assert got[-1] == "[DONE]" and raw.endswith(sse.DONE)
    assert b"id: 2-0\n" in raw and b"id: 4-0\n" in raw  # each event resumable after
    assert (still_open, gauge) == (0, 0)


def test_a_chat_stream_opens_with_the_role_before_any_entry():
    pair = FakePair()
    job(pair, JobStatus.DONE, *HELLO, DONE)

    async def go() -> bytes:
        return await whole(stream(services(pair), ChatChunks("chatcmpl-x", 1, "m"))._body())

    first = events_of(asyncio.run(go()))[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def lost_after_hello(*args, **kwargs):
    """`follow` as it reads when Redis goes away after the first entry."""
    yield [HELLO[1]]
    raise StreamLost("gone")


def test_a_lost_redis_ends_the_stream_with_an_error_then_done(monkeypatch):
    monkeypatch.setattr(answering, "follow", lost_after_hello)
    pair = FakePair()
    job(pair, JobStatus.RUNNING)

    async def go() -> bytes:
        return await whole(stream(services(pair), TextChunks(CID, 1, "m"), cancel=False)._body())

    got = events_of(asyncio.run(go()))
    assert got[0]["choices"][0]["text"] == "Hel"
    assert got[1]["error"]["code"] == errors.UNAVAILABLE.code and "interrupted" in got[1]["error"]["message"]
    assert got[2] == "[DONE]" and len(got) == 3


def test_a_bug_while_relaying_still_ends_the_stream_with_an_error_then_done():
    class Broken(ChunkEvents):
        def encode(self, rows):
            raise RuntimeError("a bug")

    pair = FakePair()
    job(pair, JobStatus.DONE, *HELLO, DONE)

    async def go() -> bytes:
        chunks = TextChunks(CID, 1, "m")
        return await whole(stream(services(pair), chunks, events=Broken(chunks, None))._body())

    got = events_of(asyncio.run(go()))
    assert len(got) == 2 and got[0]["error"]["type"] == "server_error" and got[1] == "[DONE]"


def test_nothing_to_send_for_a_while_sends_keepalives():
    pair = FakePair()
    job(pair, JobStatus.RUNNING)

    async def go() -> list[bytes]:
        s = services(pair, keepalive_s=0.01)
        body = stream(s, TextChunks(CID, 1, "m"), cancel=False)._body()
        pieces = [await asyncio.wait_for(anext(body), 2.0) for _ in range(2)]  # never a hang
        await body.aclose()
        return pieces

    keepalive = TextChunks(CID, 1, "m").keepalive()
    assert [events_of(p)[0] for p in asyncio.run(go())] == [keepalive, keepalive]


def cancel_at_after_leaving(pair: FakePair, *, cancel: bool, arrived_ms: int) -> bytes | None:
    """A client that leaves a running job's stream after its first write: the job's cancel_at."""
    job(pair, JobStatus.RUNNING, *HELLO)

    async def go() -> tuple[bytes | None, int]:
        s = services(pair, cancel_grace_s=5.0)
        body = stream(s, TextChunks(CID, 1, "m"), cancel=cancel, arrived_ms=arrived_ms)._body()
        first = await anext(body)
        assert b"Hel" in first
        await body.aclose()
        return await s.jobs._r.hget(keys.job(CID), JobField.CANCEL_AT), s.streams.count(OWNER)

    cancel_at, still_open = asyncio.run(go())
    assert still_open == 0  # its place is given back either way
    return cancel_at


def test_a_client_gone_before_the_end_cancels_its_job_after_the_grace():
    cancel_at = cancel_at_after_leaving(FakePair(), cancel=True, arrived_ms=1)
    assert cancel_at is not None
    assert now_ms() + 4000 < int(cancel_at) <= now_ms() + 5000


def test_a_client_gone_cancels_nothing_when_another_attached_since_or_the_job_is_in_the_background():
    pair = FakePair()
    pair.sync().streams.hset(keys.job(CID), JobField.KEPT_AT, 2000)
    assert cancel_at_after_leaving(pair, cancel=True, arrived_ms=1000) is None
    assert cancel_at_after_leaving(FakePair(), cancel=False, arrived_ms=1) is None


def test_a_stream_that_ends_settles_its_owners_reservation():
    pair = FakePair()
    job(pair, JobStatus.DONE, *HELLO, DONE)
    counted = reserve(pair, reserved=100, prompt=10)

    async def go() -> None:
        await whole(stream(services(pair), TextChunks(CID, 1, "m"), settles=OWNER)._body())

    asyncio.run(go())
    r = pair.sync().queues
    assert r.hget(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), CID) is None
    assert int(r.get(counted)) == 5  # what it used: 3 prompt and 2 completion tokens


def test_collect_answers_the_whole_completion_once_the_job_has_ended():
    pair = FakePair()
    job(pair, JobStatus.DONE, *HELLO, DONE)
    counted = reserve(pair, reserved=100, prompt=10)

    async def go():
        return await collect(http_request(), services(pair), TextChunks(CID, 1, "m"), 0, settles=OWNER)

    response = asyncio.run(go())
    assert response.status_code == 200
    answer = json.loads(response.body)
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == "Hello"
    assert answer["usage"]["total_tokens"] == 5
    assert int(pair.sync().queues.get(counted)) == 5


def test_collect_answers_a_failed_job_with_its_status_and_settles_its_prompts_bound():
    pair = FakePair()
    lost = Failed(epoch=1, message="the worker was lost", type="server_error", code="worker_lost")
    job(pair, JobStatus.FAILED, *HELLO, ("4-0", lost))
    counted = reserve(pair, reserved=100, prompt=10)

    async def go():
        return await collect(http_request(), services(pair), TextChunks(CID, 1, "m"), 0, settles=OWNER)

    response = asyncio.run(go())
    assert response.status_code == 503
    assert json.loads(response.body)["error"]["code"] == "worker_lost"
    assert int(pair.sync().queues.get(counted)) == 10


def test_collect_writes_an_answer_of_vectors_in_pieces():
    pair = FakePair()
    vectors = b"\x00\x00\x80\x3f" + b"\x00\x00\x00\x40"  # 1.0 and 2.0 as float32
    end = Finished(finish_reason="stop", prompt_tokens=4, completion_tokens=0, vectors=vectors, dimensions=1)
    job(pair, JobStatus.DONE, ("1-0", end))

    async def go() -> tuple[int, bytes]:
        response = await collect(http_request(), services(pair), EmbeddingObjects(CID, "e"), 0)
        return response.status_code, b"".join([p async for p in response.body_iterator])

    status, raw = asyncio.run(go())
    listing = json.loads(raw)
    assert status == 200 and [d["embedding"] for d in listing["data"]] == [[1.0], [2.0]]
    assert listing["usage"] == {"prompt_tokens": 4, "total_tokens": 4}


def test_collect_answers_499_and_cancels_the_job_when_its_client_has_gone(monkeypatch):
    async def quiet(*args, **kwargs):
        yield KEEPALIVE

    monkeypatch.setattr(answering, "follow", quiet)
    pair = FakePair()
    job(pair, JobStatus.QUEUED)

    async def go():
        return await collect(
            http_request(disconnected=True), services(pair, cancel_grace_s=0), TextChunks(CID, 1, "m"), 0
        )

    assert asyncio.run(go()).status_code == 499
    r = pair.sync().streams
    assert r.hget(keys.job(CID), JobField.STATUS) == JobStatus.CANCELLED.encode()  # queued: ended at once


def test_collect_is_a_503_when_the_queue_is_unreachable(monkeypatch):
    async def lost(*args, **kwargs):
        raise StreamLost("gone")
        yield  # an async generator

    monkeypatch.setattr(answering, "follow", lost)

    async def go():
        return await collect(http_request(), services(FakePair()), TextChunks(CID, 1, "m"), 0)

    with pytest.raises(APIError) as info:
        asyncio.run(go())
    assert info.value.status == 503 and info.value.code == errors.UNAVAILABLE.code


def test_respond_is_the_answers_status_and_json_body():
    response = respond(Answer(202, {"id": "cmpl-1", "status": "queued"}))
    assert response.status_code == 202 and json.loads(response.body) == {"id": "cmpl-1", "status": "queued"}
    assert response.headers["content-type"] == "application/json"


def test_settling_and_cancelling_are_best_effort_when_redis_is_away():
    pair = FakePair()
    pair.queues.connected = False
    pair.streams.connected = False

    async def go() -> None:
        s = services(pair)
        await settle(s, OWNER, CID, DONE[1])
        await cancel_quietly(s, CID, 0)

    asyncio.run(go())  # neither raises


def test_a_stream_cut_short_settles_nothing(monkeypatch):
    """Only an end settles: what the job reserved stays, for the owner's next ADMIT to settle."""

    monkeypatch.setattr(answering, "follow", lost_after_hello)
    pair = FakePair()
    job(pair, JobStatus.RUNNING)
    counted = reserve(pair, reserved=100, prompt=10)

    async def go() -> None:
        await whole(stream(services(pair), TextChunks(CID, 1, "m"), cancel=False, settles=OWNER)._body())

    asyncio.run(go())
    r = pair.sync().queues
    assert r.hget(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), CID) is not None
    assert int(r.get(counted)) == 100


def test_settling_without_an_end_charges_the_whole_reservation():
    pair = FakePair()
    counted = reserve(pair, reserved=100, prompt=10)

    async def go() -> None:
        await settle(services(pair), OWNER, CID, Delta(text="x", token_ids=(1,)))

    asyncio.run(go())
    r = pair.sync().queues
    assert r.hget(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), CID) is None
    assert int(r.get(counted)) == 100
