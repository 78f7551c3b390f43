"""api/endpoints/completions/routes.py: the legacy completions' four paths, on the shared handlers."""

from __future__ import annotations

from api.endpoints.catalog import TEXT
from api.endpoints.completions.routes import routes


def test_completions_are_created_retrieved_deleted_and_cancelled_at_their_own_paths():
    got = {(r.path, m) for r in routes() for m in r.methods or () if m != "HEAD"}
    one = TEXT.path + "/{completion_id}"
    assert got == {(TEXT.path, "POST"), (one, "GET"), (one, "DELETE"), (one + "/cancel", "POST")}
    assert {r.endpoint.__self__.endpoint for r in routes()} == {TEXT}  # type: ignore[attr-defined]
