"""An embed job's answer: OpenAI's list of embedding objects, in the inputs' order.

Each object is a float array or the base64 of its float32 bytes, as `encoding_format` asked.
The vectors come from the job's terminal entry.

A client waiting for it gets that list written a piece at a time (`written`). Built whole, it
would be too big: 2,048 vectors of 4,096 floats are 160 MB of JSON. That takes seconds of CPU
and several times that in memory. It would take them in the one lane where every large
request body is parsed. Each piece is about `PIECE_BYTES`, a fraction of a millisecond of
CPU. The event loop serves every other request between two of them."""

from __future__ import annotations

import array
import base64
import json
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import anyio
from starlette.responses import StreamingResponse

from api.endpoints.protocol import Answer
from api.jobs.state import JobState
from contract.entries import CANCELLED, Failed, Finished, Rows
from contract.errors import error_body, failure_body, status_of
from contract.tiers import served_model

ID_PREFIX = "embd-"
PIECE_BYTES = 32 * 1024
"""A written answer's pieces are about this long."""
FLOATS_A_PART = 256
"""Floats formatted at once (a fraction of a millisecond)."""


def _json(value: object) -> bytes:
    """As Starlette's JSONResponse writes it: the written answer is the same bytes."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def floats(raw: bytes) -> list[float]:
    """Little-endian float32 bytes as Python floats."""
    values = array.array("f", raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


@dataclass(frozen=True)
class EmbeddingObjects:
    object = "list"

    id: str
    # as the request named it
    model: str
    encoding_format: str = "float"

    @classmethod
    def of(cls, job: JobState) -> EmbeddingObjects:
        echo = json.loads(job.echo) if job.echo else {}
        return cls(
            job.id, echo.get("model") or served_model(job.model)[0], echo.get("encoding_format", "float")
        )

    def answer(self, rows: Rows) -> Answer | None:
        for _, entry in rows:
            if isinstance(entry, Failed):
                return Answer(status_of(entry), failure_body(entry))
            if isinstance(entry, Finished):
                if entry.finish_reason == CANCELLED:
                    return Answer(
                        499,
                        error_body("The request was cancelled.", "invalid_request_error", "cancelled", None),
                    )
                return Answer(200, self.listing(entry))
        return None

    def listing(self, entry: Finished) -> dict:
        return {
            "object": "list",
            "data": [self._item(entry, i) for i in range(_count(entry))],
            "model": self.model,
            "usage": {"prompt_tokens": entry.prompt_tokens, "total_tokens": entry.prompt_tokens},
        }

    def written(self, rows: Rows) -> StreamingResponse | None:
        """The answer as a response written a piece at a time, where it carries vectors. None where
        it carries none: `answer` builds that small answer."""
        end = rows[-1][1] if rows else None
        if not isinstance(end, Finished) or end.finish_reason == CANCELLED or not end.vectors:
            return None
        return StreamingResponse(self._pieces(end), media_type="application/json")

    async def _pieces(self, entry: Finished) -> AsyncIterator[bytes]:
        """`listing(entry)` as JSON, in pieces of about PIECE_BYTES, the loop free between two."""
        piece = bytearray(b'{"object":"list","data":[')
        for i in range(_count(entry)):
            for part in self._item_parts(entry, i):
                piece += part
                if len(piece) >= PIECE_BYTES:
                    yield bytes(piece)
                    piece.clear()
                    await anyio.sleep(0)
        usage = {"prompt_tokens": entry.prompt_tokens, "total_tokens": entry.prompt_tokens}
        yield bytes(piece) + b"]," + _json({"model": self.model, "usage": usage})[1:]

    def _item_parts(self, entry: Finished, i: int) -> Iterator[bytes]:
        """`_item(entry, i)` as JSON, a float vector a slice of FLOATS_A_PART at a time. A vector of
        4,096 floats is 2 ms of CPU at once."""
        head = {"object": "embedding", "index": i}
        yield (b"," if i else b"") + _json(head)[:-1] + b',"embedding":'
        size = entry.dimensions * 4
        raw = entry.vectors[i * size : (i + 1) * size]
        if self.encoding_format == "base64":
            yield _json(base64.b64encode(raw).decode()) + b"}"
            return
        values = floats(raw)
        for start in range(0, len(values), FLOATS_A_PART):
            yield (b"," if start else b"[") + _json(values[start : start + FLOATS_A_PART])[1:-1]
        yield b"]}"

    def _item(self, entry: Finished, i: int) -> dict:
        size = entry.dimensions * 4
        raw = entry.vectors[i * size : (i + 1) * size]
        vector: list[float] | str = (
            base64.b64encode(raw).decode() if self.encoding_format == "base64" else floats(raw)
        )
        return {"object": "embedding", "index": i, "embedding": vector}

    def pending(self, queued: bool) -> Answer:
        return Answer(
            202, {"id": self.id, "object": "embedding.job", "status": "queued" if queued else "in_progress"}
        )

    def cancelled(self, status: str) -> dict:
        return {"id": self.id, "object": "embedding.job", "status": status}

    def deleted(self) -> dict:
        return {"id": self.id, "object": "embedding.job.deleted", "deleted": True}


def _count(entry: Finished) -> int:
    size = entry.dimensions * 4
    return len(entry.vectors) // size if size else 0
