"""Every error a client can get, in one catalogue.

Each error has its code, OpenAI error type, HTTP status and usual message. Both sides build from
the catalogue. The API builds an error response from it (`api.http.errors.APIError`). A worker or
the API builds a stream's terminal `Failed` entry (`ErrorCode.entry`). The API also maps a
stream's failure back to its HTTP status (`status_of`). It does so for a client that does not
stream. A code is written in this module only.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.entries import Failed

INVALID_REQUEST_ERROR = "invalid_request_error"
RATE_LIMIT_ERROR = "rate_limit_error"
SERVER_ERROR = "server_error"


@dataclass(frozen=True)
class ErrorCode:
    # None: `"code": null`, as OpenAI answers a body it cannot read
    code: str | None
    type: str
    status: int
    # the usual message; a call may give a more precise one
    message: str = ""

    def body(self, message: str | None = None, param: str | None = None) -> dict:
        """The OpenAI error object: `{"error": {"message", "type", "param", "code"}}`."""
        return error_body(message or self.message, self.type, self.code, param)

    def entry(self, message: str | None = None, param: str | None = None, epoch: int = 0) -> Failed:
        """A stream's terminal entry for this error.

        An attempt gives its epoch. The END script stamps its own (0 here)."""
        return Failed(
            epoch=epoch, message=message or self.message, type=self.type, code=self.code or "", param=param
        )

    def brief(self, message: str | None = None) -> dict:
        """`{"code", "message"}`: a Batch API line's error in its output (no status is sent)."""
        return {"code": self.code, "message": message or self.message}


def error_body(message: str, type_: str, code: str | None, param: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def failure_body(failed: Failed) -> dict:
    """A stream's failure as the error object a client receives."""
    return error_body(failed.message, failed.type, failed.code, failed.param)


_CATALOGUE: dict[str | None, ErrorCode] = {}


def _error(code: str | None, type_: str, status: int, message: str = "") -> ErrorCode:
    error = ErrorCode(code, type_, status, message)
    _CATALOGUE[code] = error
    return error


# 400: the request cannot be run as it is.
BAD_REQUEST = _error(None, INVALID_REQUEST_ERROR, 400)
INVALID_VALUE = _error("invalid_value", INVALID_REQUEST_ERROR, 400)
UNSUPPORTED = _error("unsupported_parameter", INVALID_REQUEST_ERROR, 400)
MISSING_PARAMETER = _error("missing_required_parameter", INVALID_REQUEST_ERROR, 400)
ARRAY_TOO_LONG = _error("array_above_max_length", INVALID_REQUEST_ERROR, 400)
STRING_TOO_LONG = _error("string_above_max_length", INVALID_REQUEST_ERROR, 400)
INVALID_CURSOR = _error("invalid_cursor", INVALID_REQUEST_ERROR, 400)
# a Responses reasoning item's encrypted_content that this deployment did not seal for the key
INVALID_ENCRYPTED_CONTENT = _error("invalid_encrypted_content", INVALID_REQUEST_ERROR, 400)
# a job the worker cannot run
INVALID_REQUEST = _error("invalid_request", INVALID_REQUEST_ERROR, 400)
CONTEXT_LENGTH = _error("context_length_exceeded", INVALID_REQUEST_ERROR, 400)
# 401, 403, 404, 405, 413, 415, 422
MISSING_API_KEY = _error(
    "missing_api_key",
    INVALID_REQUEST_ERROR,
    401,
    "You didn't provide an API key. Provide it in the Authorization header as 'Bearer YOUR_KEY'.",
)
INVALID_API_KEY = _error("invalid_api_key", INVALID_REQUEST_ERROR, 401, "Incorrect API key provided.")
CROSS_SITE = _error(
    "cross_site_request",
    INVALID_REQUEST_ERROR,
    403,
    "This server needs no API key, so it answers only its own pages and clients that are not "
    "browsers: a request from another site is refused.",
)
UNKNOWN_HOST = _error(
    "unknown_host",
    INVALID_REQUEST_ERROR,
    400,
    "This server needs no API key, so it answers only the host names in ALLOWED_HOSTS.",
)
OPERATOR_ONLY = _error(
    "operator_only",
    INVALID_REQUEST_ERROR,
    403,
    "This route shows the whole pool, other keys' work included: it needs an operator key.",
)
TIER_NOT_ALLOWED = _error("tier_not_allowed", INVALID_REQUEST_ERROR, 403)
MODEL_NOT_FOUND = _error("model_not_found", INVALID_REQUEST_ERROR, 404)
NOT_FOUND = _error("not_found", INVALID_REQUEST_ERROR, 404, "This completion no longer exists.")
METHOD_NOT_ALLOWED = _error("method_not_allowed", INVALID_REQUEST_ERROR, 405)
TOO_LARGE = _error("request_too_large", INVALID_REQUEST_ERROR, 413)
NOT_JSON = _error(
    "unsupported_media_type",
    INVALID_REQUEST_ERROR,
    415,
    "The request body must be JSON, sent with 'Content-Type: application/json'.",
)
IDEMPOTENCY_CONFLICT = _error(
    "idempotency_key_reused",
    INVALID_REQUEST_ERROR,
    422,
    "This Idempotency-Key was already used with a different request.",
)
# 429: come back later (with Retry-After).
QUEUE_FULL = _error("queue_full", RATE_LIMIT_ERROR, 429)
TOO_MANY_JOBS = _error("too_many_requests", RATE_LIMIT_ERROR, 429)
TOO_MANY_STREAMS = _error("too_many_streams", RATE_LIMIT_ERROR, 429)
RATE_LIMITED = _error("rate_limit_exceeded", RATE_LIMIT_ERROR, 429)
# 5xx: the server could not do it.
INTERNAL = _error("internal_error", SERVER_ERROR, 500, "Internal server error.")
WORKER_ERROR = _error("worker_error", SERVER_ERROR, 500, "The worker failed.")
WORKER_LOST = _error(
    "worker_lost",
    SERVER_ERROR,
    503,
    "The worker generating this completion was lost and no other worker could resume it.",
)
ROLLED_BACK = _error(
    "stream_rolled_back",
    SERVER_ERROR,
    503,
    "A Redis failover lost part of this completion that was already sent, together with the worker "
    "that could have restored it; its replay now differs from what this stream sent.",
)
QUEUE_TIMEOUT = _error(
    "queue_timeout", SERVER_ERROR, 503, "No worker started this request in time; try again later."
)
UNAVAILABLE = _error("service_unavailable", SERVER_ERROR, 503, "The queue is unavailable; try again shortly.")
STORAGE_FULL = _error(
    "storage_full", SERVER_ERROR, 503, "The server is holding as much work as it can; try again shortly."
)
REQUEST_TIMEOUT = _error(
    "request_timeout", INVALID_REQUEST_ERROR, 408, "The request body did not arrive in time."
)
DEADLINE = _error(
    "deadline_exceeded", SERVER_ERROR, 504, "The completion did not finish within the server's time limit."
)

# A Batch API line's own ends, in its batch's error file (`brief`; never an HTTP answer).
BATCH_CANCELLED = _error(
    "batch_cancelled", INVALID_REQUEST_ERROR, 400, "The request was cancelled before it finished."
)
BATCH_EXPIRED = _error(
    "batch_expired", INVALID_REQUEST_ERROR, 400, "The batch expired before this request finished."
)
BATCH_FAILED = _error("batch_failed", SERVER_ERROR, 500, "The batch failed before this request finished.")


def lookup(code: str | None) -> ErrorCode | None:
    return _CATALOGUE.get(code)


def status_of(failed: Failed) -> int:
    """The HTTP status a stream's failure maps to for a client that does not stream."""
    known = _CATALOGUE.get(failed.code)
    return known.status if known is not None else 500
