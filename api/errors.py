"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse


@dataclass
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type_: str, code: str | None, param: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", code, param)


# Status codes an error raised by a worker maps to when the client is not streaming.
WORKER_ERROR_STATUS = {
    "context_length_exceeded": 400,
    "invalid_request": 400,
    "model_not_found": 404,
    "not_found": 404,
    "worker_lost": 503,
    "queue_timeout": 503,
    "service_unavailable": 503,
    "deadline_exceeded": 504,
}
