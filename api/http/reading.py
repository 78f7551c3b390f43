"""Reading a request's body: bounded in size and in time, and JSON only where JSON is meant.
Every route that takes a body reads it here: the endpoints, Files and Batch."""

from __future__ import annotations

import anyio
from starlette.requests import Request

from api.http.errors import APIError
from contract import errors


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, up to `limit` bytes (413 beyond), within `timeout_s` (408 beyond). A client
    that trickles its body holds a connection and a task for nothing."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    with anyio.move_on_after(timeout_s) as scope:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    if scope.cancelled_caught:
        raise APIError(errors.REQUEST_TIMEOUT)
    return bytes(body)


async def read_json(request: Request, limit: int, timeout_s: float) -> bytes:
    """A JSON body (`read_body`), sent as `application/json` (415 otherwise). A web page can
    send another site a `text/plain` or form body without asking, but never a JSON one."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        raise APIError(errors.NOT_JSON)
    return await read_body(request, limit, timeout_s)


def _too_large(limit: int) -> APIError:
    return APIError(errors.TOO_LARGE, f"The request body exceeds the limit of {limit} bytes.")
