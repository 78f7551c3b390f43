"""SSE event ids: where a client is in a job's stream. With one, it can resume from any replica.

Every data event carries an id that orders it within the job. The events come from stream
entries, so their ids are the entries' ids. A delta or an error gets its entry's id
(`1795...-0`). The API synthesizes three events, with ids around the entry they come from.
The chat role chunk is sent before any entry, with the id `0-0` (below every entry id). The
finish chunk gets the Finished entry's id. The usage chunk after it gets that id + `/usage`.

Keep-alives and `data: [DONE]` carry no id. A resume sends everything after the cursor.

The Responses and Messages streams number their events instead (`numbered`). A resume sends
the events numbered above the cursor.

While the job runs, a cursor ahead of what is written is waited for. It may name an entry a
replica has yet to see (docs/protocol.md, "Failover"). Once the job has ended, nothing more is
written. So a cursor after its last event is refused (`past_end`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPENING = "0-0"
USAGE_SUFFIX = "/usage"
_PATTERN = re.compile(r"(\d{1,20})-(\d{1,20})(/usage)?")
# a stream id is two unsigned 64-bit integers; Redis refuses more
_MAX_PART = 2**64 - 1


_MAX_NUMBER = 10**9


class BadCursor(ValueError):
    pass


def past_end(cursor: str, last: str) -> str:
    """Why a cursor after the last event of an ended job's stream is refused. `cursor` and
    `last` are both the stream's own forms, never the client's raw text."""
    return f"The stream has ended: {cursor} is after its last event, {last}."


def numbered(raw: str | None) -> int:
    """The event number a numbered stream resumes after (-1: from its start)."""
    if raw is None:
        return -1
    if not raw.isascii() or not raw.isdigit() or int(raw) > _MAX_NUMBER:
        raise BadCursor(f"not an event number of this stream: {raw[:64]!r}")
    return int(raw)


@dataclass(frozen=True)
class Cursor:
    # the stream entry the client's last event came from ("0-0": the opening)
    entry_id: str
    # for a Finished entry: the usage chunk was sent too
    usage_sent: bool = False

    @classmethod
    def parse(cls, value: str) -> Cursor:
        m = _PATTERN.fullmatch(value)
        if not m or int(m[1]) > _MAX_PART or int(m[2]) > _MAX_PART:
            raise BadCursor(f"not an event id of this stream: {value[:64]!r}")
        return cls(entry_id=f"{int(m[1])}-{int(m[2])}", usage_sent=bool(m[3]))

    @property
    def after_opening(self) -> bool:
        return self.entry_id == OPENING
