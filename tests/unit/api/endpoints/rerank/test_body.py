"""api.endpoints.rerank.body: Cohere's and Jina's body, and what is refused before a job."""

import json

import pytest

from api.endpoints.rerank.body import RerankRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.settings import Limits
from contract import keys
from contract.jobspec import JobSpec

LIMITS = Limits(max_rerank_documents=3, max_prompt_chars=100)


def _body(**kw) -> RerankRequest:
    return parse(RerankRequest, json.dumps({"model": "m", **kw}).encode())


def _echo(body: RerankRequest) -> dict:
    return json.loads(body.job_fields("rerank-1")[keys.JobField.ECHO])


def test_strings_and_objects_become_the_inputs_of_one_rank_job_in_the_rerank_pool():
    body = _body(query="q", documents=["a", {"text": "b"}], top_n=1, return_documents=True, priority=5)
    body.enforce(LIMITS)
    spec = body.to_spec("rerank-1", LIMITS)
    assert spec == JobSpec(id="rerank-1", kind="rank", model="m#rank", inputs=("q", "a", "b"), max_tokens=0)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert _echo(body) == {"model": "m", "top_n": 1, "documents": ["a", "b"], "raw_scores": False}


def test_top_n_past_the_documents_is_all_of_them_and_raw_scores_follow_the_setting():
    body = _body(query="q", documents=["a", "b"], top_n=9)
    body.enforce(LIMITS)
    body.to_spec("rerank-1", Limits(rerank_raw_scores=True))
    assert _echo(body) == {"model": "m", "top_n": 2, "documents": None, "raw_scores": True}


def test_the_service_tier_is_the_queue_tier_not_cohere_s_priority():
    body = _body(query="q", documents=["a"], priority=999, service_tier="flex")
    assert body.to_spec("rerank-1", LIMITS).priority == "flex"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "", "documents": ["a"]}, "query"),
        ({"documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", ""]}, "documents"),
        ({"query": "q", "documents": [{"text": "a", "title": "t"}]}, "documents"),
        ({"query": "q", "documents": "a"}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ({"query": "q", "documents": ["a"], "priority": 1000}, "priority"),
        ({"query": "q", "documents": ["a"], "stream": True}, "stream"),
        ({"query": "q", "documents": ["a"], "user": "u"}, "user"),
        ({"query": "q", "documents": ["a"], "temperature": 1}, "temperature"),
    ],
)
def test_a_bad_body_is_refused_naming_the_field(body, param):
    with pytest.raises(APIError) as e:
        _body(**body)
    assert e.value.param.startswith(param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "q", "documents": ["a"] * 4}, "documents"),
        ({"query": "q" * 60, "documents": ["a" * 41]}, "documents"),
        ({"query": "q" * 40, "documents": ["a"] * 3}, "documents"),  # 123 characters of pairs
        ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
        ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 8}, "max_tokens_per_doc"),
        ({"query": "q", "documents": ["a"], "max_chunks_per_doc": 8}, "max_chunks_per_doc"),
    ],
)
def test_a_body_past_a_limit_is_refused_naming_the_field(body, param):
    with pytest.raises(APIError) as e:
        _body(**body).enforce(LIMITS)
    assert e.value.param == param


def test_the_longest_pair_is_what_one_context_must_hold():
    body = _body(query="qq", documents=["a", "bbbb", "cc"], rank_fields=["text"])
    body.enforce(LIMITS)
    assert body.context_chars() == (6, "documents[1]")
    assert body.prompt_chars() == (3 * 2 + 7, "documents")  # the query once per document
