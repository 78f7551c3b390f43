"""api.endpoints.rerank.objects: a terminal entry's raw scores as Cohere's results."""

import math

import numpy as np
import pytest

from api.endpoints.rerank.objects import RerankObjects, ranked, sigmoid
from contract.entries import Finished

RAW = np.array([-1.0, 2.0, 0.5, 2.0], dtype="<f4")
END = Finished(
    epoch=1, finish_reason="stop", prompt_tokens=40, completion_tokens=0, vectors=RAW.tobytes(), dimensions=1
)


def test_results_are_best_first_as_sigmoids_with_usage():
    body = RerankObjects("rerank-1", "m").answer([("1-0", END)]).body
    assert [r["index"] for r in body["results"]] == [1, 3, 2, 0]  # a tie: the earlier document
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [1 / (1 + math.exp(-x)) for x in (2.0, 2.0, 0.5, -1.0)]
    )
    assert all("document" not in r for r in body["results"])
    assert body["model"] == "m" and body["usage"] == {"prompt_tokens": 40, "total_tokens": 40}


def test_top_n_and_documents_and_raw_scores():
    objects = RerankObjects("rerank-1", "m", top_n=2, documents=("a", "b", "c", "d"), raw_scores=True)
    results = objects.answer([("1-0", END)]).body["results"]
    assert results == [
        {"index": 1, "relevance_score": 2.0, "document": {"text": "b"}},
        {"index": 3, "relevance_score": 2.0, "document": {"text": "d"}},
    ]


def test_the_sigmoid_holds_at_either_end():
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0 and sigmoid(0.0) == 0.5
    assert ranked([0.1, 0.3, 0.2], 5) == [1, 2, 0]


def test_the_answer_is_never_an_embeddings_listing_written_in_pieces():
    assert RerankObjects("rerank-1", "m").written([("1-0", END)]) is None
