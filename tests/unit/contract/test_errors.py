"""contract/errors.py: the one error catalogue, as an HTTP body, a stream's terminal entry and a Batch
line's error, and a stream's failure mapped back to its HTTP status."""

from __future__ import annotations

import pytest

from contract import errors
from contract.entries import Failed, decode, encode


def _catalogue() -> list[errors.ErrorCode]:
    return [v for v in vars(errors).values() if isinstance(v, errors.ErrorCode)]


def test_a_body_is_openai_s_error_object_with_the_usual_message_unless_told_otherwise():
    assert errors.QUEUE_FULL.body("Too many waiting.") == {
        "error": {
            "message": "Too many waiting.",
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }
    assert errors.NOT_FOUND.body(param="id") == {
        "error": {
            "message": "This completion no longer exists.",
            "type": "invalid_request_error",
            "param": "id",
            "code": "not_found",
        }
    }


def test_a_body_the_server_cannot_read_has_a_null_code():
    body = errors.BAD_REQUEST.body("We could not parse the JSON body of your request.")
    assert body["error"]["code"] is None and body["error"]["type"] == "invalid_request_error"
    assert errors.BAD_REQUEST.status == 400


def test_an_entry_carries_the_error_and_the_attempt_s_epoch_through_the_stream():
    entry = errors.CONTEXT_LENGTH.entry("Your prompt is 9000 tokens.", param="messages", epoch=3)
    assert entry == Failed(
        epoch=3,
        message="Your prompt is 9000 tokens.",
        type="invalid_request_error",
        code="context_length_exceeded",
        param="messages",
    )
    assert decode(encode(entry)) == entry
    assert errors.WORKER_LOST.entry().epoch == 0  # END stamps its own
    assert errors.BAD_REQUEST.entry("x").code == ""  # a stream field is a string


def test_a_stream_s_failure_becomes_the_body_a_client_receives():
    failed = errors.DEADLINE.entry(epoch=2)
    assert errors.failure_body(failed) == errors.DEADLINE.body()
    other = Failed(epoch=1, message="m", type="server_error", code="custom", param="p")
    assert errors.failure_body(other) == {
        "error": {"message": "m", "type": "server_error", "param": "p", "code": "custom"}
    }


def test_a_batch_line_s_error_is_its_code_and_message_only():
    assert errors.BATCH_EXPIRED.brief() == {
        "code": "batch_expired",
        "message": "The batch expired before this request finished.",
    }
    assert errors.WORKER_ERROR.brief("CUDA out of memory") == {
        "code": "worker_error",
        "message": "CUDA out of memory",
    }


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.CONTEXT_LENGTH, 400),
        (errors.INVALID_REQUEST, 400),
        (errors.QUEUE_TIMEOUT, 503),
        (errors.WORKER_LOST, 503),
        (errors.ROLLED_BACK, 503),
        (errors.STORAGE_FULL, 503),
        (errors.DEADLINE, 504),
        (errors.WORKER_ERROR, 500),
    ],
)
def test_a_stream_s_failure_maps_back_to_its_http_status(error, status):
    assert errors.status_of(error.entry(epoch=4)) == status


def test_a_failure_of_a_code_the_catalogue_lacks_is_a_server_error():
    assert (
        errors.status_of(Failed(epoch=1, message="?", type="server_error", code="from_a_newer_worker")) == 500
    )
    assert errors.lookup("from_a_newer_worker") is None


def test_every_code_is_written_once_and_looked_up_as_itself():
    """A second error of one code would silently take the first's place in `lookup`."""
    catalogue = _catalogue()
    codes = [e.code for e in catalogue]
    assert len(codes) == len(set(codes))
    for error in catalogue:
        assert errors.lookup(error.code) is error
        if error.code is not None:
            assert errors.status_of(error.entry()) == error.status
        assert 400 <= error.status < 600
        assert error.type in (errors.INVALID_REQUEST_ERROR, errors.RATE_LIMIT_ERROR, errors.SERVER_ERROR)
        assert (error.type == errors.RATE_LIMIT_ERROR) == (error.status == 429)
