"""A Batch API input file's lines (JSONL, OpenAI's `BatchRequestInput`), checked on upload.

Each line is checked the way the endpoint it names would check its body. A bad line is a 400
naming its number, before anything is stored or queued."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.endpoints.body import Body
from api.endpoints.catalog import BATCHABLE
from api.http.errors import APIError, invalid
from api.http.parsing import parse
from api.settings import Limits
from contract import errors


class _Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    custom_id: Annotated[str, Field(min_length=1, max_length=512)]
    method: str
    url: str
    body: dict


@dataclass(frozen=True)
class Line:
    # from 1, as an editor shows it
    number: int
    custom_id: str
    url: str
    body: dict

    @property
    def pool(self) -> str:
        """The pool its job waits in. An embeddings line's is its model's embedding pool. A
        rerank line's is its rerank pool."""
        return self.request().pool

    def request(self) -> Body:
        """The line's body as its endpoint's request (checked on upload: it parses)."""
        return parse(BATCHABLE[self.url].body, json.dumps(self.body).encode())


def parse_lines(content: bytes, limits: Limits, max_lines: int) -> list[Line]:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid("The file is not UTF-8 text.", param="file") from None
    rows = [(n, raw) for n, raw in enumerate(text.splitlines(), start=1) if raw.strip()]
    if not rows:
        raise invalid("The file has no request lines.", param="file")
    if len(rows) > max_lines:
        raise invalid(f"The file has {len(rows)} request lines; the limit is {max_lines}.", param="file")
    lines, seen = [], set()
    for number, raw in rows:
        line = _parse(number, raw, limits)
        if line.custom_id in seen:
            raise _bad(number, f"custom_id {line.custom_id[:64]!r} is used by an earlier line")
        seen.add(line.custom_id)
        lines.append(line)
    return lines


def _parse(number: int, raw: str, limits: Limits) -> Line:
    try:
        line = _Line.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the line"
        raise _bad(number, f"{where}: {first['msg']}") from None
    if line.method != "POST":
        raise _bad(number, "method must be POST")
    if line.url not in BATCHABLE:
        raise _bad(number, f"url must be one of {', '.join(BATCHABLE)}")
    if line.body.get("stream") or line.body.get("background"):
        raise _bad(number, "a batch request is neither streamed nor in the background")
    out = Line(number, line.custom_id, line.url, line.body)
    try:
        request = out.request()
        request.enforce(limits)
        # tools, formats, the conversation: as the endpoint would
        request.to_spec("check", limits)
    except APIError as exc:
        raise _bad(number, exc.message) from None
    return out


def _bad(number: int, why: str) -> APIError:
    return invalid(f"Line {number}: {why}", param="file", error=errors.INVALID_VALUE)
