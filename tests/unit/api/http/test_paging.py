"""OpenAI's cursor pages, as every list route answers them."""

from __future__ import annotations

import json

import pytest
from starlette.requests import Request

from api.http.errors import APIError
from api.http.paging import page

ITEMS = [{"id": f"i{n}"} for n in range(5)]


def get(query: str, **kw) -> dict:
    request = Request(
        {"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers": []}
    )
    return json.loads(page(request, ITEMS, max_limit=3, default_limit=2, **kw).body)


def test_newest_first_by_default_and_on_after_the_cursor():
    first = get("")
    assert [i["id"] for i in first["data"]] == ["i4", "i3"] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == ("i4", "i3")
    rest = get("after=i1")
    assert [i["id"] for i in rest["data"]] == ["i0"] and rest["has_more"] is False
    assert [i["id"] for i in get("order=asc&limit=3")["data"]] == ["i0", "i1", "i2"]


def test_an_unknown_cursor_is_the_end_and_a_list_without_order_ignores_it():
    assert get("after=gone") == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    assert [i["id"] for i in get("order=asc", order=False)["data"]] == ["i4", "i3"]


@pytest.mark.parametrize("query", ["limit=0", "limit=4", "limit=x", "order=up"])
def test_bad_parameters_are_400(query):
    with pytest.raises(APIError) as caught:
        get(query)
    assert caught.value.status == 400
