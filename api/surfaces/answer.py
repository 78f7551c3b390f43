"""A job's whole answer when the client did not stream: what every surface's objects build
(api/surfaces/catalog.py `Objects.answer`), sent as one JSON response."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """A non-streamed response: its status and body."""

    status: int
    body: dict
