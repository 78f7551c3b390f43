"""api/ops/openapi.py: `/openapi.json` is a sound OpenAPI 3.1 document (every reference found,
every path parameter declared) that describes exactly the app's `/v1` routes, and whose request
schemas accept and refuse what the pydantic models do."""

from __future__ import annotations

import re

import jsonschema
import pytest
from pydantic import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from starlette.routing import Match
from starlette.testclient import TestClient

from api.app import create_app
from api.batches.routes import BatchRequest
from api.endpoints.catalog import CHAT, EMBEDDINGS, MESSAGES, RERANK, RESPONSES, TEXT
from api.endpoints.messages.routes import CountRequest
from api.http.errors import APIError, invalid
from api.jobs.admission import not_found
from api.ops.openapi import document
from api.settings import Access, Settings
from contract import errors

METHODS = {"get", "post", "delete", "put", "patch"}
PARAM = re.compile(r"\{([^}]+)\}")


def operations() -> list[tuple[str, str, dict]]:
    return [(p, m, op) for p, ops in document()["paths"].items() for m, op in ops.items() if m in METHODS]


def refs(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in refs(v)]
    return []


def schema_errors(name: str, body: dict) -> list[str]:
    """What the document's schema `name` says is wrong with `body`, its references resolved."""
    registry = Registry().with_resource("urn:doc", Resource.from_contents(document(), DRAFT202012))
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry
    )
    return [e.message for e in validator.iter_errors(body)]


def test_every_reference_resolves_and_every_schema_is_valid_json_schema():
    doc = document()
    assert doc["openapi"] == "3.1.0"
    found = refs(doc)
    assert len(found) > 50
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref  # none left pointing at a model's own $defs
        assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"], ref
    for name, schema in doc["components"]["schemas"].items():
        assert "$defs" not in schema, name
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_path_parameter_is_declared_required_on_each_of_its_operations():
    for path, method, op in operations():
        declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path" and p["required"]}
        assert declared == set(PARAM.findall(path)), f"{method} {path}"


def test_the_document_names_exactly_the_app_s_v1_routes_and_methods():
    app = create_app(Settings(access=Access(api_keys=("sesame",))))  # no lifespan: no Redis
    routes = app.router.routes
    for path, method, _ in operations():
        scope = {"type": "http", "path": PARAM.sub("x1", path), "method": method.upper()}
        assert any(r.matches(scope)[0] is Match.FULL for r in routes), (
            f"documented, not served: {method} {path}"
        )
    served = {(r.path.replace(":path", ""), m.lower()) for r in routes for m in r.methods if m != "HEAD"}
    documented = {(p, m) for p, m, _ in operations()}
    assert {s for s in served if s[0].startswith("/v1/")} == documented


def test_each_job_endpoint_is_created_fetched_purged_and_cancelled_with_its_own_body():
    paths = document()["paths"]
    for endpoint in (CHAT, TEXT, RESPONSES, MESSAGES):
        body = paths[endpoint.path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{endpoint.body.__name__}"}
        assert set(paths[endpoint.path + "/{completion_id}"]) == {"get", "delete"}
        assert set(paths[endpoint.path + "/{completion_id}/cancel"]) == {"post"}
        created = paths[endpoint.path]["post"]["responses"]
        assert {"200", "202", "400", "401", "429"} <= set(created)
        assert "text/event-stream" in created["200"]["content"]
    for endpoint in (EMBEDDINGS, RERANK):
        assert endpoint.path + "/{completion_id}" not in paths  # answered at once, never fetched


def test_the_error_schema_describes_the_errors_the_api_answers():
    for error in (
        APIError(errors.MISSING_API_KEY),
        not_found("m"),
        invalid("Invalid 'kind'.", param="kind"),
        APIError(errors.QUEUE_FULL),
    ):
        assert schema_errors("Error", error.body()) == []
    assert schema_errors("Error", {"error": {"message": "x"}}) != []
    for path, method, op in operations():
        assert op["responses"]["401"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }, f"{method} {path}"


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TURNS = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]  # the Messages API's blocks


@pytest.mark.parametrize(
    ("model", "body", "accepted"),
    [
        (CHAT.body, CHAT_BODY, True),
        (CHAT.body, {"messages": CHAT_BODY["messages"]}, False),
        (CHAT.body, {**CHAT_BODY, "temperature": 5}, False),
        (CHAT.body, {**CHAT_BODY, "messages": [{"role": "wizard", "content": "hi"}]}, False),
        (TEXT.body, {"model": "m", "prompt": "hi"}, True),
        (RESPONSES.body, {"model": "m", "input": "hi"}, True),
        (MESSAGES.body, {"model": "m", "max_tokens": 10, "messages": TURNS}, True),
        (MESSAGES.body, {"model": "m", "messages": TURNS}, False),  # its max_tokens is required
        (CountRequest, {"model": "m", "messages": TURNS}, True),
        (EMBEDDINGS.body, {"model": "e", "input": "hi"}, True),
        (EMBEDDINGS.body, {"model": "e", "input": "hi", "encoding_format": "hex"}, False),
        (RERANK.body, {"model": "r", "query": "q", "documents": ["a", "b"]}, True),
        (RERANK.body, {"model": "r", "query": "q"}, False),
        (
            BatchRequest,
            {"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "24h"},
            True,
        ),
        (
            BatchRequest,
            {"input_file_id": "f", "endpoint": "/v1/responses", "completion_window": "24h"},
            False,
        ),
        (
            BatchRequest,
            {"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "48h"},
            False,
        ),
    ],
)
def test_a_request_schema_accepts_and_refuses_what_its_model_does(model, body, accepted):
    try:
        model.model_validate(body)
        validated = True
    except ValidationError:
        validated = False
    assert validated is accepted
    assert (schema_errors(model.__name__, body) == []) is accepted


def test_the_document_is_served_as_json_behind_a_key():
    client = TestClient(create_app(Settings(access=Access(api_keys=("sesame",)))))
    assert client.get("/openapi.json").status_code == 401
    resp = client.get("/openapi.json", headers={"Authorization": "Bearer sesame"})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    served = resp.json()
    assert served["security"] == [{"bearer": []}]
    assert served["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert "/v1/chat/completions" in served["paths"] and "/metrics" not in served["paths"]


def test_a_chat_request_s_system_message_is_described_as_chat_s_not_as_the_messages_api_s():
    """Both APIs have a model named `SystemMessage`. Keyed by name alone, the Messages API's
    (role "system" only, content a list of blocks) replaced chat's, and the documented
    ChatRequest refused the system and developer messages the API accepts."""
    for role in ("system", "developer"):
        body = {"model": "m", "messages": [{"role": role, "content": "Be brief."}, *CHAT_BODY["messages"]]}
        CHAT.body.model_validate(body)  # the API takes it
        assert schema_errors("ChatRequest", body) == [], role
