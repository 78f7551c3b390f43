"""OpenAI's cursor pages (`{"object": "list", "data", "first_id", "last_id", "has_more"}`).
Every list route pages this one way. Its parameters are `limit`, `after` (an id), and
`order` where the list has one."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.http.errors import invalid


def page(
    request: Request, objects: list[dict], *, max_limit: int, default_limit: int, order: bool = True
) -> Response:
    """One page of a list, given oldest first. It reads `order`, `limit` and `after` (an
    id), as OpenAI's cursor pages do. `order` is desc by default, when the list has one."""
    query = request.query_params
    raw_limit = query.get("limit", str(default_limit))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= max_limit:
        raise invalid(f"Invalid 'limit': an integer from 1 to {max_limit}.", param="limit")
    direction = query.get("order", "desc") if order else "desc"
    if direction not in ("asc", "desc"):
        raise invalid("Invalid 'order': 'asc' or 'desc'.", param="order")
    if direction == "desc":
        objects = objects[::-1]
    start = 0
    if after := query.get("after"):
        ids = [o["id"] for o in objects]
        start = ids.index(after) + 1 if after in ids else len(ids)
    chunk = objects[start : start + int(raw_limit)]
    return JSONResponse(
        {
            "object": "list",
            "data": chunk,
            "first_id": chunk[0]["id"] if chunk else None,
            "last_id": chunk[-1]["id"] if chunk else None,
            "has_more": start + len(chunk) < len(objects),
        }
    )
