"""An embed job's answer: OpenAI's list of embedding objects, in the inputs' order, each a
float array or the base64 of its float32 bytes (what `encoding_format` asked), from the
vectors its terminal entry carries."""

from __future__ import annotations

import array
import base64
import json
import sys
from dataclasses import dataclass

from api.endpoints.protocol import Answer
from api.jobs.state import JobState
from contract.entries import CANCELLED, Failed, Finished, Rows
from contract.errors import error_body, failure_body, status_of
from contract.tiers import served_model

ID_PREFIX = "embd-"


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
    model: str  # as the request named it
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
        size = entry.dimensions * 4
        count = len(entry.vectors) // size if size else 0
        data = []
        for i in range(count):
            raw = entry.vectors[i * size : (i + 1) * size]
            vector: list[float] | str = (
                base64.b64encode(raw).decode() if self.encoding_format == "base64" else floats(raw)
            )
            data.append({"object": "embedding", "index": i, "embedding": vector})
        return {
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": entry.prompt_tokens, "total_tokens": entry.prompt_tokens},
        }

    def pending(self, queued: bool) -> Answer:
        return Answer(
            202, {"id": self.id, "object": "embedding.job", "status": "queued" if queued else "in_progress"}
        )

    def cancelled(self, status: str) -> dict:
        return {"id": self.id, "object": "embedding.job", "status": status}

    def deleted(self) -> dict:
        return {"id": self.id, "object": "embedding.job.deleted", "deleted": True}
