"""api.endpoints.embeddings.objects: the vectors of a terminal entry as OpenAI's list."""

import asyncio
import base64
import dataclasses
import json

import numpy as np
import pytest
from starlette.responses import JSONResponse

from api.endpoints.embeddings.objects import PIECE_BYTES, EmbeddingObjects
from api.jobs.state import JobState
from contract import errors
from contract.entries import Finished

VECTORS = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]], dtype="<f4")
END = Finished(
    epoch=1,
    finish_reason="stop",
    prompt_tokens=9,
    completion_tokens=0,
    vectors=VECTORS.tobytes(),
    dimensions=2,
)


def test_floats_in_input_order_with_usage_and_the_model_as_asked():
    answer = EmbeddingObjects("embd-1", "m").answer([("1-0", END)])
    assert answer is not None and answer.status == 200
    body = answer.body
    assert body["object"] == "list" and body["model"] == "m"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert np.allclose([d["embedding"] for d in body["data"]], VECTORS)
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}


def test_base64_is_each_vectors_float32_bytes():
    body = EmbeddingObjects("embd-1", "m", "base64").answer([("1-0", END)]).body
    got = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]]
    assert np.array_equal(np.stack(got), VECTORS)


def test_a_failure_is_its_error_with_its_status():
    failed = errors.CONTEXT_LENGTH.entry("too long", "input[1]", epoch=1)
    answer = EmbeddingObjects("embd-1", "m").answer([("1-0", failed)])
    assert answer.status == 400 and answer.body["error"]["param"] == "input[1]"


def test_the_job_records_the_model_and_encoding_its_request_named():
    echo = json.dumps({"model": "m", "encoding_format": "base64"})
    job = JobState(
        id="embd-1", endpoint="embeddings", model="m#embed", created=0, owner="", status="done", echo=echo
    )
    assert EmbeddingObjects.of(job) == EmbeddingObjects("embd-1", "m", "base64")


def written(objects: EmbeddingObjects, rows) -> tuple[list[bytes], bytes]:
    async def go() -> tuple[list[bytes], bytes]:
        response = objects.written(rows)
        assert response is not None and response.media_type == "application/json"
        pieces = [p async for p in response.body_iterator]
        return pieces, JSONResponse(objects.answer(rows).body).body

    return asyncio.run(go())


@pytest.mark.parametrize("shape", [(1000, 64), (40, 1000)])  # many small vectors; wide ones, in slices
@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_a_written_answer_is_the_whole_answer_s_bytes_in_pieces(shape, encoding):
    many = np.random.default_rng(0).random(shape, dtype=np.float32)
    end = dataclasses.replace(END, vectors=many.astype("<f4").tobytes(), dimensions=shape[1], prompt_tokens=7)
    pieces, whole = written(EmbeddingObjects("embd-1", "m", encoding), [("1-0", end)])
    assert b"".join(pieces) == whole  # byte for byte what JSONResponse would have sent
    assert len(pieces) > 2 and max(map(len, pieces)) < PIECE_BYTES + 8_000  # never built whole


def test_only_vectors_are_written_in_pieces():
    failed = errors.CONTEXT_LENGTH.entry("too long", "input[1]", epoch=1)
    cancelled = Finished(epoch=1, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)
    for end in (failed, cancelled):
        assert EmbeddingObjects("embd-1", "m").written([("1-0", end)]) is None
