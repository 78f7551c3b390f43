"""api/endpoints/protocol.py: the values every endpoint hands the shared routes (`Answer`,
`EncodedEvents`), which objects write their answer in pieces (`LargeAnswers`, checked at run
time), and the promises each endpoint's `Objects` keeps."""

from __future__ import annotations

import dataclasses

import pytest
from starlette.responses import StreamingResponse

from api.endpoints.catalog import BY_NAME
from api.endpoints.chat.objects import ChatChunks
from api.endpoints.completions.objects import TextChunks
from api.endpoints.embeddings.objects import EmbeddingObjects
from api.endpoints.protocol import Answer, EncodedEvents, LargeAnswers
from api.endpoints.rerank.objects import RerankObjects
from api.jobs.state import JobState
from contract.entries import Delta, Finished


def test_an_answer_and_an_encoded_write_are_values_that_cannot_change():
    assert Answer(200, {"a": 1}) == Answer(200, {"a": 1}) != Answer(202, {"a": 1})
    assert (
        EncodedEvents(b"data: x\n\n", 1)
        == EncodedEvents(b"data: x\n\n", 1)
        != EncodedEvents(b"data: x\n\n", 0)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        Answer(200, {}).status = 500  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        EncodedEvents(b"", 0).contents = 3  # type: ignore[misc]


def test_only_objects_with_a_written_answer_are_written():
    """`collect` writes an answer in pieces exactly when its objects are `LargeAnswers`."""
    assert isinstance(EmbeddingObjects("embd-1", "m"), LargeAnswers)
    assert isinstance(RerankObjects("rerank-1", "m"), LargeAnswers)  # its `written` says None: whole
    assert not isinstance(ChatChunks("chatcmpl-1", 1, "m"), LargeAnswers)
    assert not isinstance(TextChunks("cmpl-1", 1, "m"), LargeAnswers)


def test_written_is_structural_any_class_with_a_written_method_is_one():
    class Pieces:
        def written(self, rows):
            return None

    class Whole:
        def answer(self, rows):
            return None

    assert isinstance(Pieces(), LargeAnswers) and not isinstance(Whole(), LargeAnswers)


def test_embeddings_with_vectors_are_written_in_pieces_and_reranks_never_are():
    vectors = Finished(
        finish_reason="stop", prompt_tokens=2, completion_tokens=0, vectors=b"\0\0\x80?", dimensions=1
    )
    rows = [("1-0", vectors)]
    assert isinstance(EmbeddingObjects("embd-1", "m").written(rows), StreamingResponse)
    assert RerankObjects("rerank-1", "m").written(rows) is None


def _job(name: str) -> JobState:
    endpoint = BY_NAME[name]
    return JobState(
        id=endpoint.id_prefix + "abc", endpoint=name, model="m", created=5, owner="", status="running"
    )


@pytest.mark.parametrize("name", sorted(set(BY_NAME) - {"responses"}))
def test_every_endpoints_objects_answer_nothing_until_the_job_ends(name):
    """None: `collect` waits on, and a retrieve answers the pending status instead."""
    objects = BY_NAME[name].objects_of(_job(name))
    assert objects.id == BY_NAME[name].id_prefix + "abc"
    assert objects.answer([]) is None
    assert objects.answer([("1-0", Delta(text="x", token_ids=(1,)))]) is None


def test_a_response_answers_with_its_state_so_far_before_it_ends():
    objects = BY_NAME["responses"].objects_of(_job("responses"))
    answer = objects.answer([("1-0", Delta(text="x", token_ids=(1,)))])
    assert answer.status == 200 and answer.body["status"] == "in_progress"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_endpoints_objects_say_a_pending_job_is_not_done_and_a_deleted_one_is_deleted(name):
    objects = BY_NAME[name].objects_of(_job(name))
    pending = objects.pending(queued=True)
    assert pending.status in (200, 202)
    deleted = objects.deleted()
    assert deleted["id"] == objects.id and deleted["deleted"] is True
