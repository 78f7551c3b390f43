"""A rank job's answer, in Cohere's shape, which Jina's, vLLM's and llama-server's share.

`results` holds each document's `index` and `relevance_score`, and its `document` when asked.
The best come first, at most `top_n` of them. The scores come from the job's terminal entry,
one raw float32 per document. A relevance score is the sigmoid of the model's score, in 0..1
as Cohere's are. With RERANK_RAW_SCORES the API gives the raw scores, as llama-server does."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from api.endpoints.embeddings.objects import EmbeddingObjects, floats
from api.endpoints.protocol import Answer
from api.jobs.state import JobState
from contract.entries import Finished, Rows
from contract.tiers import served_model

ID_PREFIX = "rerank-"


def sigmoid(x: float) -> float:
    """1 / (1 + e^-x), without overflow at either end."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def ranked(scores: list[float], top_n: int) -> list[int]:
    """The documents' indices, the best score first (ties: the earlier document), `top_n` of them."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:top_n]


@dataclass(frozen=True)
class RerankObjects(EmbeddingObjects):
    """An embed job's objects but the listing. Cancels, failures and pending states are theirs."""

    object = "list"

    # 0: every document
    top_n: int = 0
    # their texts, when the request asked them back
    documents: tuple[str, ...] | None = None
    raw_scores: bool = False

    @classmethod
    def of(cls, job: JobState) -> RerankObjects:
        echo = json.loads(job.echo) if job.echo else {}
        documents = echo.get("documents")
        return cls(
            job.id,
            echo.get("model") or served_model(job.model)[0],
            top_n=echo.get("top_n", 0),
            documents=None if documents is None else tuple(documents),
            raw_scores=echo.get("raw_scores", False),
        )

    def listing(self, entry: Finished) -> dict:
        scores = floats(entry.vectors)
        results = []
        for i in ranked(scores, self.top_n or len(scores)):
            score = scores[i] if self.raw_scores else sigmoid(scores[i])
            result: dict = {"index": i, "relevance_score": score}
            if self.documents is not None:
                result["document"] = {"text": self.documents[i]}
            results.append(result)
        tokens = entry.prompt_tokens
        return {
            "id": self.id,
            "object": "list",
            "model": self.model,
            "results": results,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "meta": {"billed_units": {"input_tokens": tokens}},
        }

    def written(self, rows: Rows) -> None:
        """Never written in pieces, as an embeddings answer of many vectors is. It is one float a
        document, and `answer` has it whole."""
        return None

    def pending(self, queued: bool) -> Answer:
        return Answer(
            202, {"id": self.id, "object": "rerank.job", "status": "queued" if queued else "in_progress"}
        )
