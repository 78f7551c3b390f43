"""api.endpoints.embeddings.body: OpenAI's four input shapes, and what is refused before a job."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.endpoints.embeddings.body import EmbeddingRequest
from api.http.errors import APIError
from api.http.parsing import parse
from api.jobs.reservation import embedding_inputs
from api.settings import Limits
from contract import keys
from contract.jobspec import JobSpec

LIMITS = Limits(
    max_embedding_inputs=4, max_embedding_tokens=12, max_prompt_chars=100, matryoshka_models=("mrl",)
)


def _body(**kw) -> EmbeddingRequest:
    return parse(EmbeddingRequest, json.dumps({"model": "m", **kw}).encode())


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("one text", ("one text",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
    ],
)
def test_each_input_shape_becomes_the_inputs_of_one_embed_job_in_the_embedding_pool(given, inputs):
    body = _body(input=given, encoding_format="base64", user="u-1")
    body.enforce(LIMITS)
    spec = body.to_spec("embd-1", LIMITS)
    assert spec == JobSpec(id="embd-1", kind="embed", model="m#embed", inputs=inputs, max_tokens=0)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert json.loads(body.job_fields("embd-1")[keys.JobField.ECHO]) == {
        "model": "m",
        "encoding_format": "base64",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": [""]}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [[1], []]}, "input"),
        ({"input": [-1]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "stream": True}, "stream"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "temperature": 1}, "temperature"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_parameter(body, param):
    with pytest.raises(APIError) as caught:
        parse(EmbeddingRequest, json.dumps({"model": "m", **body}).encode())
    assert caught.value.status == 400 and caught.value.body()["error"]["param"].startswith(param)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"input": ["a"] * 5}, "array_above_max_length"),  # inputs over MAX_EMBEDDING_INPUTS
        (
            {"input": [list(range(7)), list(range(6))]},
            "invalid_request_error",
        ),  # ids over MAX_EMBEDDING_TOKENS
        ({"input": ["abc", "def"]}, "invalid_request_error"),  # strings: bytes and 4 each, over
        ({"input": "ééééx"}, "invalid_request_error"),  # 5 characters, 9 bytes, 13 tokens at most
        ({"input": "x" * 101}, "string_above_max_length"),  # characters over MAX_PROMPT_CHARS
        ({"input": "a", "dimensions": 8}, "unsupported_parameter"),  # not a Matryoshka model
    ],
)
def test_limits_are_a_400_before_anything_is_enqueued(body, code):
    with pytest.raises(APIError) as caught:
        _body(**body).enforce(LIMITS)
    error = caught.value.body()["error"]
    assert caught.value.status == 400 and code in (error["code"], error["type"])


def test_dimensions_are_taken_for_a_declared_matryoshka_model():
    body = parse(EmbeddingRequest, json.dumps({"model": "mrl", "input": "a", "dimensions": 8}).encode())
    body.enforce(LIMITS)
    assert body.to_spec("embd-1", LIMITS).dimensions == 8


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4), max_leaves=10)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["model", "input", "encoding_format", "dimensions", "user"]), values))
def test_any_body_is_a_valid_job_or_a_400(body):
    try:
        req = parse(EmbeddingRequest, json.dumps(body).encode())
        req.enforce(LIMITS)
    except APIError as exc:
        assert exc.status == 400 and exc.body()["error"]["message"]
        return
    spec = req.to_spec("embd-fuzz", LIMITS)
    assert spec.model == req.pool and JobSpec.from_dict(spec.to_dict()) == spec


def test_the_context_must_hold_the_longest_input_not_their_sum():
    assert _body(input=["ab", "abcd", "a"]).context_chars() == (4, "input[1]")
    assert _body(input="abc").context_chars() == (3, "input")
    assert _body(input=[[1, 2, 3]]).context_chars()[0] == 0  # token arrays: counted by the worker


def test_a_request_s_tokens_are_bounded_by_ids_and_bytes_before_any_tokenizer():
    assert embedding_inputs([[1, 2, 3], "ab", "é"]) == 3 + (2 + 4) + (2 + 4)
    body = _body(input=["ab", "cde"])  # 13 tokens at most: over the bound of 12...
    with pytest.raises(APIError) as caught:
        body.enforce(LIMITS)
    _body(input=["ab", "cd"]).enforce(LIMITS)  # ...12: the bound itself passes
    error = caught.value.body()["error"]
    assert error["param"] == "input" and "13 tokens" in error["message"]
    assert "12 per request" in error["message"]
