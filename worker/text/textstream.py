"""Turns generated tokens into publishable text pieces.

Tokens are byte pieces. A multi-byte UTF-8 character can be split across two tokens, and a stop
string can be split across several. `TextAssembler` holds tokens back until their text is whole
and cannot be the start of a stop string. Then it releases the text together with the ids of the
tokens that produced it. The stream contract requires this of a delta.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    text: str
    token_ids: tuple[int, ...]


class TextAssembler:
    """Feed tokens with `push`; call `flush` when generation ends without a stop string."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._stop = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._text = ""
        # a stop string was found; nothing more may be pushed
        self.stopped = False
        # the stop string found (the earliest in the text)
        self.matched = ""

    def push(self, token_id: int, piece: bytes) -> Piece | None:
        """Add one token. Return the text now safe to publish, if any."""
        if self.stopped:
            raise RuntimeError("push after a stop string")
        self._ids.append(token_id)
        self._text += self._decoder.decode(piece)
        if self._decoder.getstate()[0]:
            # the last character is incomplete
            return None
        found = self._find_stop()
        if found is not None:
            cut, self.matched = found
            self.stopped = True
            return self._release(self._text[:cut])
        if self._ends_with_stop_prefix():
            return None
        return self._release(self._text)

    def flush(self) -> Piece | None:
        """Release whatever is held when generation ends. A character whose last bytes were never
        generated (max_tokens fell between its tokens) is dropped, not turned into U+FFFD. Its
        token ids are still released, as they were generated."""
        if self.stopped:
            return None
        self._decoder.reset()
        return self._release(self._text) if self._ids else None

    def _release(self, text: str) -> Piece | None:
        piece = Piece(text=text, token_ids=tuple(self._ids))
        self._ids = []
        self._text = ""
        return piece if piece.text or piece.token_ids else None

    def _find_stop(self) -> tuple[int, str] | None:
        """(where the earliest stop string starts, which one), if any is in the text."""
        hits = [(i, s) for i, s in ((self._text.find(s), s) for s in self._stop) if i >= 0]
        return min(hits, key=lambda hit: hit[0]) if hits else None

    def _ends_with_stop_prefix(self) -> bool:
        return any(self._text.endswith(s[:n]) for s in self._stop for n in range(1, len(s)))
