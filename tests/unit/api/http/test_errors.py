"""The error catalogue: one code, one type, one status, the same on every path."""

from __future__ import annotations

from pathlib import Path

from api.http.errors import APIError
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
