"""api/endpoints/chat/routes.py: chat's four paths, each on the handler every endpoint shares."""

from __future__ import annotations

from api.endpoints.catalog import CHAT
from api.endpoints.chat.routes import routes


def test_chat_is_created_retrieved_deleted_and_cancelled_at_its_own_paths():
    got = {(r.path, m) for r in routes() for m in r.methods or () if m != "HEAD"}
    one = CHAT.path + "/{completion_id}"
    assert got == {(CHAT.path, "POST"), (one, "GET"), (one, "DELETE"), (one + "/cancel", "POST")}
    assert {r.endpoint.__self__.endpoint for r in routes()} == {CHAT}  # type: ignore[attr-defined]
