"""Pydantic's errors as a 400 naming the parameter at fault, whichever union branch it is in."""

from __future__ import annotations

import json

import pytest

from api.endpoints.chat.body import ChatRequest
from api.endpoints.responses.body import ResponsesRequest
from api.http.errors import APIError
from api.http.parsing import parse


def _refusal(body_type, body: dict) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(body_type, json.dumps(body).encode())
    return caught.value


@pytest.mark.parametrize(
    ("body_type", "body", "param"),
    [
        # a list of parts that is wrong is named there, not as "not a string"
        (ChatRequest, {"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
         "messages[0].content[0].text"),
        (ResponsesRequest, {"model": "m", "input": [{"type": "function_call", "call_id": "c"}]},
         "input[0].name"),
        (ChatRequest, {"model": "m", "messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
        (ChatRequest, {"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ],
)  # fmt: skip
def test_the_deepest_error_names_the_parameter(body_type, body, param):
    assert _refusal(body_type, body).param == param
