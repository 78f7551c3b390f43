"""Error responses, made from the catalogue in `contract.errors`. They take OpenAI's shape,
or Anthropic's on the Messages API's paths (`anthropic`). So each endpoint's SDK reads its
own errors."""

from __future__ import annotations

# the router's own path matching
from starlette._utils import get_route_path
from starlette.responses import JSONResponse
from starlette.types import Scope

from contract.errors import INVALID_VALUE, QUEUE_FULL, ErrorCode

# Anthropic's endpoint: its errors are Anthropic's
MESSAGES_PATH = "/v1/messages"
# Anthropic's status for a server too busy to take the request
OVERLOADED = 529

# Anthropic's error types by the catalogue's statuses; any other 4xx is an invalid request.
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
}


def anthropic(error: ErrorCode, message: str) -> tuple[int, dict]:
    """(status, body) of `error` as Anthropic's API answers it. A server too busy for the
    request is its `overloaded_error`, 529, which its SDKs retry. Too busy means a request
    timeout, no worker in time, or the queue unavailable or full. A key over its own limits
    stays a 429."""
    status = error.status
    if status in (408, 503) or error is QUEUE_FULL:
        status, kind = OVERLOADED, "overloaded_error"
    elif status in _ANTHROPIC_TYPES:
        kind = _ANTHROPIC_TYPES[status]
    elif status < 500:
        kind = "invalid_request_error"
    else:
        status, kind = 500, "api_error"
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def speaks_anthropic(scope: Scope) -> bool:
    """Whether the request came to the Messages API (by the path as the router matches it)."""
    path = get_route_path(scope)
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class APIError(Exception):
    """An error response: raised anywhere in a handler, answered by the app's handler."""

    def __init__(
        self,
        error: ErrorCode,
        message: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or error.message)
        self.error = error
        self.message = message or error.message
        self.param = param
        self.headers = headers

    @property
    def status(self) -> int:
        return self.error.status

    @property
    def code(self) -> str | None:
        return self.error.code

    @property
    def type(self) -> str:
        return self.error.type

    def body(self) -> dict:
        return self.error.body(self.message, self.param)

    def response(self, scope: Scope | None = None) -> JSONResponse:
        """The error in the shape of the endpoint `scope` (the request) came to."""
        if scope is not None and speaks_anthropic(scope):
            status, body = anthropic(self.error, self.message)
            return JSONResponse(body, status_code=status, headers=self.headers)
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, error: ErrorCode = INVALID_VALUE) -> APIError:
    """A 400 naming the parameter at fault."""
    return APIError(error, message, param)
