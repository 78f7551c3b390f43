"""OpenAI-style error responses, made from the catalogue in `contract.errors`."""

from __future__ import annotations

from starlette.responses import JSONResponse

from contract.errors import INVALID_VALUE, ErrorCode


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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, error: ErrorCode = INVALID_VALUE) -> APIError:
    """A 400 naming the parameter at fault."""
    return APIError(error, message, param)
