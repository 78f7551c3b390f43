"""What every endpoint that creates jobs gives the shared routes and the answering code
(api/endpoints/routes.py, answering.py).

Each endpoint lives in its own folder. It gives its objects for a job (`Objects`). `Events` is
its SSE encoding of a job's entries, each write an `EncodedEvents`. `Answer` is a whole answer
for a client that did not stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from starlette.responses import Response

from contract.entries import Rows
from contract.errors import ErrorCode


@dataclass(frozen=True)
class Answer:
    """A non-streamed response: its status and body."""

    status: int
    body: dict


@dataclass(frozen=True)
class EncodedEvents:
    # one write (may be empty: nothing the client lacks)
    data: bytes
    # content events in it
    contents: int


class Events(Protocol):
    """An endpoint's stream encoding, as answering.py writes it: from where, and each batch of
    entries. `check_within` gets an ended job's whole stream. It raises BadCursor
    (api/streaming/cursor.py) if the client's cursor is after its last event."""

    def read_from(self) -> tuple[str, bool]: ...
    def check_within(self, rows: Rows) -> None: ...
    def opening(self) -> bytes: ...
    def encode(self, rows: Rows) -> EncodedEvents: ...
    def keepalive(self) -> bytes: ...
    def error(self, error: ErrorCode, message: str | None = None) -> bytes: ...
    def done(self) -> bytes: ...


@runtime_checkable
class LargeAnswers(Protocol):
    """Objects whose whole answer may be megabytes (embeddings' vectors). `written` is that answer
    as a response written a piece at a time. The event loop is free between two pieces. It is None
    where `answer`'s is small."""

    def written(self, rows: Rows) -> Response | None: ...


class Objects(Protocol):
    """An endpoint's objects for one job (its folder's objects.py)."""

    object: str
    id: str

    def answer(self, rows: Any) -> Answer | None: ...
    def pending(self, queued: bool) -> Answer: ...
    def deleted(self) -> dict: ...
