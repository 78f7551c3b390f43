"""api/endpoints/catalog.py: each endpoint's ids (made unguessable, recognised before use), and
which endpoints are streamed, batched and found by name."""

from __future__ import annotations

import re

import pytest

from api.endpoints.catalog import (
    BATCHABLE,
    BY_NAME,
    CHAT,
    EMBEDDINGS,
    ENDPOINTS,
    MESSAGES,
    RERANK,
    RESPONSES,
    TEXT,
)
from api.jobs.state import JobState
from contract import keys

EVERY = (CHAT, TEXT, RESPONSES, MESSAGES, EMBEDDINGS, RERANK)


@pytest.mark.parametrize("endpoint", EVERY, ids=lambda e: e.name)
def test_a_new_id_is_the_prefix_and_25_letters_or_digits(endpoint):
    job_id = endpoint.new_id()
    assert job_id.startswith(endpoint.id_prefix)
    assert re.fullmatch(r"[A-Za-z0-9]{25}", job_id[len(endpoint.id_prefix) :])
    assert endpoint.owns(job_id)


def test_new_ids_do_not_repeat():
    assert len({CHAT.new_id() for _ in range(2000)}) == 2000


def test_a_new_id_is_a_valid_rq_job_id_for_every_attempt():
    """RQ ids allow letters, digits, '_' and '-': a continuation id must map back to its job."""
    for endpoint in EVERY:
        job_id = endpoint.new_id()
        for epoch in (0, 1, 7):
            rq_id = keys.rq_job_id(job_id, epoch)
            assert re.fullmatch(r"[A-Za-z0-9_-]+", rq_id)
            assert keys.job_of(rq_id) == job_id


@pytest.mark.parametrize(
    "job_id",
    [
        "chatcmpl-abc",
        "chatcmpl-a_b-c",  # an id of an earlier release
        "chatcmpl-" + "x" * 64,
    ],
)
def test_chat_owns_its_ids_of_every_release(job_id):
    assert CHAT.owns(job_id)


@pytest.mark.parametrize(
    "job_id",
    [
        "chatcmpl-",  # nothing after the prefix
        "chatcmpl-" + "x" * 65,  # too long
        "chatcmpl-abc\n",
        "chatcmpl-a/b",
        "chatcmpl-a b",
        "chatcmpl-é",
        "cmpl-abc",  # another endpoint's
        "resp_abc",
        "CHATCMPL-abc",
        "xchatcmpl-abc",
        "",
    ],
)
def test_an_id_that_is_not_chats_is_not_owned(job_id):
    assert not CHAT.owns(job_id)


def test_no_endpoint_owns_another_endpoints_new_ids():
    for maker in EVERY:
        job_id = maker.new_id()
        assert [e.name for e in EVERY if e.owns(job_id)] == [maker.name]


def test_each_endpoints_objects_are_built_from_the_job():
    job = JobState(id="cmpl-abc", endpoint="text", model="m", created=17, owner="", status="queued")
    objects = TEXT.objects_of(job)
    assert (objects.id, objects.created, objects.model) == ("cmpl-abc", 17, "m")
    assert TEXT.object == "text_completion" and CHAT.object == "chat.completion"
    assert (RESPONSES.object, MESSAGES.object, EMBEDDINGS.object, RERANK.object) == (
        "response",
        "message",
        "list",
        "list",
    )


def test_only_the_streamed_endpoints_are_retrieved_by_id_and_only_four_paths_are_batchable():
    assert {e.name for e in ENDPOINTS} == {"chat", "text", "responses", "messages"}
    assert all(e.events is not None for e in ENDPOINTS)
    assert EMBEDDINGS.events is None and RERANK.events is None
    assert BATCHABLE == {
        "/v1/chat/completions": CHAT,
        "/v1/completions": TEXT,
        "/v1/embeddings": EMBEDDINGS,
        "/v1/rerank": RERANK,
    }
    assert {e.name: e for e in EVERY} == BY_NAME
    assert len({e.path for e in EVERY}) == len(EVERY)  # one path per endpoint
