"""`GET /openapi.json`: the API described in OpenAPI 3.1.

It is built from the same pydantic models that validate the requests. So the description
cannot drift from what is enforced."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse

from api.batches.routes import BatchRequest
from api.endpoints.catalog import EMBEDDINGS, ENDPOINTS, RERANK, Endpoint
from api.endpoints.messages.routes import CountRequest

# where every schema sits in the document
REF = "#/components/schemas/"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_OBJECT = {"type": "object"}
_ID = {"name": "completion_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {
            "description": "an OpenAI-style error",
            "content": {"application/json": {"schema": {"$ref": REF + "Error"}}},
        }
        for c in codes
    }


def _json(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _OBJECT}}}


def _create(endpoint: Endpoint) -> dict[str, Any]:
    model: type[BaseModel] = endpoint.body
    return {
        "post": {
            "summary": f"Create a {endpoint.object}",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF + model.__name__}}},
            },
            "responses": {
                "200": {
                    "description": "the completion, or its SSE stream when `stream` is true",
                    "content": {"application/json": {"schema": _OBJECT}, "text/event-stream": {}},
                },
                "202": _json("accepted as a background job (`background` or `Prefer: respond-async`)"),
                **_errors(400, 401, 404, 413, 429, 503),
            },
        }
    }


def _job(endpoint: Endpoint) -> dict[str, Any]:
    kind = endpoint.object
    return {
        "get": {
            "summary": f"Fetch a {kind}, or with stream=true replay and follow its stream",
            "parameters": [
                _ID,
                {"name": "stream", "in": "query", "schema": {"type": "string", "enum": ["true", "false"]}},
                {"name": "starting_after", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {
                "200": {
                    "description": "the finished object, or the SSE stream",
                    "content": {"application/json": {"schema": _OBJECT}, "text/event-stream": {}},
                },
                "202": _json("not finished yet"),
                **_errors(400, 401, 404, 429, 503, 504),
            },
        },
        "delete": {
            "summary": f"Purge a {kind}'s data now",
            "parameters": [_ID],
            "responses": {"200": _json("deleted"), **_errors(401, 404)},
        },
    }


def _cancel(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "post": {
            "summary": f"Cancel a {endpoint.object}",
            "parameters": [_ID],
            "responses": {"200": _json("cancelled, cancelling, or already ended"), **_errors(401, 404)},
        }
    }


def _files_and_batches() -> dict[str, Any]:
    file_id = {"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}
    batch_id = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
    upload = {
        "type": "object",
        "required": ["purpose", "file"],
        "properties": {
            "purpose": {"type": "string", "enum": ["batch", "vision", "user_data"]},
            "file": {"type": "string", "format": "binary"},
        },
    }
    listed = {"200": _json("a page"), **_errors(400, 401)}
    return {
        "/v1/files": {
            "post": {
                "summary": "Upload a batch input file (JSONL, checked line by line)",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": upload}}},
                "responses": {"200": _json("the file"), **_errors(400, 401, 413)},
            },
            "get": {"summary": "List files", "responses": listed},
        },
        "/v1/files/{file_id}": {
            "get": {"parameters": [file_id], "responses": {"200": _json("the file"), **_errors(401, 404)}},
            "delete": {"parameters": [file_id], "responses": {"200": _json("deleted"), **_errors(401, 404)}},
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "parameters": [file_id],
                "responses": {"200": {"description": "the bytes"}, **_errors(401, 404)},
            }
        },
        "/v1/batches": {
            "post": {
                "summary": "Create a batch",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": REF + "BatchRequest"}}},
                },
                "responses": {"200": _json("the batch"), **_errors(400, 401, 404, 429)},
            },
            "get": {"summary": "List batches", "responses": listed},
        },
        "/v1/batches/{batch_id}": {
            "get": {"parameters": [batch_id], "responses": {"200": _json("the batch"), **_errors(401, 404)}}
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "parameters": [batch_id],
                "responses": {"200": _json("the batch"), **_errors(400, 401, 404)},
            }
        },
    }


def _bodies() -> dict[str, Any]:
    """Every request body's schema and the models under them, made in one pass. So two
    models of one name (chat's and the Messages API's `SystemMessage`) get a name each."""
    bodies = [e.body for e in ENDPOINTS] + [CountRequest, EMBEDDINGS.body, RERANK.body]
    refs, top = models_json_schema([(b, "validation") for b in bodies], ref_template=REF + "{model}")
    for body in bodies:
        assert refs[body, "validation"]["$ref"] == REF + body.__name__, body  # paths cite it so
    return top["$defs"]


@functools.cache
def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": _ERROR, **_bodies()}
    paths: dict[str, Any] = {}
    for endpoint in ENDPOINTS:
        paths[endpoint.path] = _create(endpoint)
        paths[endpoint.path + "/{completion_id}"] = _job(endpoint)
        paths[endpoint.path + "/{completion_id}/cancel"] = _cancel(endpoint)
    paths["/v1/responses/{completion_id}/input_items"] = {
        "get": {
            "summary": "List a response's input items",
            "parameters": [
                _ID,
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                {"name": "after", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {"200": _json("a page of input items"), **_errors(400, 401, 404)},
        }
    }
    paths["/v1/messages/count_tokens"] = {
        "post": {
            "summary": "Count a message's input tokens (a worker of the model tokenizes it)",
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF + "CountRequest"}}},
            },
            "responses": {"200": _json("{input_tokens}"), **_errors(400, 401, 404, 429)},
        }
    }
    paths[EMBEDDINGS.path] = _create(EMBEDDINGS)
    paths[RERANK.path] = _create(RERANK)
    schemas["BatchRequest"] = BatchRequest.model_json_schema()
    paths.update(_files_and_batches())
    get = {"get": {"responses": {"200": _json("ok"), **_errors(401, 404)}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tokenspool", "version": "0.1.0"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            **paths,
            "/v1/models": get,
            "/v1/models/{model}": {
                "get": {
                    "parameters": [
                        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {"200": _json("the model"), **_errors(401, 404)},
                }
            },
        },
    }


async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(document())
