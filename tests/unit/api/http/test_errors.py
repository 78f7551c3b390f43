"""The error catalogue: one code, one type, one status, the same on every path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.http.errors import APIError, anthropic
from contract import errors
from contract.entries import Failed

DOCS = Path(__file__).resolve().parents[4] / "docs" / "protocol.md"


def test_a_stream_failure_and_an_error_response_are_made_from_one_entry():
    lost = errors.WORKER_LOST.entry()
    assert isinstance(lost, Failed) and lost.code == "worker_lost" and lost.type == "server_error"
    assert errors.status_of(lost) == 503
    assert errors.failure_body(lost) == APIError(errors.WORKER_LOST).body()


def test_unknown_codes_from_a_stream_map_to_500():
    assert errors.status_of(Failed(message="?", type="server_error", code="martian")) == 500


def test_every_code_is_documented():
    doc = DOCS.read_text()
    for code in errors._CATALOGUE:
        assert f"`{code}`" in doc if code else "(null)" in doc, code


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (errors.INVALID_VALUE, 400, "invalid_request_error"),
        (errors.IDEMPOTENCY_CONFLICT, 422, "invalid_request_error"),
        (errors.INVALID_API_KEY, 401, "authentication_error"),
        (errors.CROSS_SITE, 403, "permission_error"),
        (errors.MODEL_NOT_FOUND, 404, "not_found_error"),
        (errors.TOO_LARGE, 413, "request_too_large"),
        (errors.TOO_MANY_JOBS, 429, "rate_limit_error"),  # the key's own limit
        (errors.QUEUE_FULL, 529, "overloaded_error"),  # the server's: its SDKs retry 529
        (errors.QUEUE_TIMEOUT, 529, "overloaded_error"),
        (errors.UNAVAILABLE, 529, "overloaded_error"),
        (errors.REQUEST_TIMEOUT, 529, "overloaded_error"),
        (errors.INTERNAL, 500, "api_error"),
        (errors.WORKER_LOST, 529, "overloaded_error"),
        (errors.DEADLINE, 504, "timeout_error"),
    ],
)
def test_the_messages_api_gets_anthropics_types_and_statuses(error, status, kind):
    assert anthropic(error, "why") == (status, {"type": "error", "error": {"type": kind, "message": "why"}})


@pytest.mark.parametrize(
    ("path", "anthropics"),
    [
        ("/v1/messages", True),
        ("/v1/messages/count_tokens", True),
        ("/v1/messagesx", False),
        ("/v1/chat", False),
    ],
)
def test_an_error_takes_the_shape_of_the_endpoint_it_came_to(path, anthropics):
    response = APIError(errors.NOT_FOUND).response({"type": "http", "path": path, "root_path": ""})
    body = json.loads(response.body)
    assert response.status_code == 404 and (
        body["type"] == "error" if anthropics else "code" in body["error"]
    )
