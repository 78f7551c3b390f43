"""A prompt with images, as plain data (no llama.cpp).

It holds token ids, with stand-in ids where an image's rows go. It holds each image's
embeddings by the position of its first row.

The stand-ins are negative (never a vocabulary id) and derived from the image's name. So the
slots' prefix cache (worker/engine/batching.py) matches a prompt with an image exactly as it
matches text. The same image at the same place is the same prefix. Another image is not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

# where ChatPrompts puts an image part (worker/engine/prompts.py), before its rows
IMAGE = -1


class Prompt(list):
    """Token ids (stand-ins at images' rows) and `images`: position -> rows (n x n_embd)."""

    images: dict[int, Any]

    def __init__(self, ids: Sequence[int] = (), images: dict[int, Any] | None = None) -> None:
        super().__init__(ids)
        self.images = images or {}


def stand_ins(name: str, rows: int) -> list[int]:
    """The ids an image's rows hold in a context: its own, from its name. The name is its
    hash, with `:low` for one read at low detail (contract.media.images.names)."""
    base = int(hashlib.sha256(name.encode()).hexdigest()[:15], 16)
    return [-(2 + base + i) for i in range(rows)]


# text ids mtmd puts around an image (its begin/end tokens), or its rows
Piece = list[int] | Any


def expand(ids: Sequence[int], images: Sequence[tuple[str, list[Piece]]]) -> Prompt:
    """`ids` with each IMAGE, in order, replaced by its image's pieces. Text ids go in as they
    are. An embedding block (rows x n_embd) goes in by its stand-ins, recorded at its position."""
    out = Prompt()
    left = iter(images)
    for token in ids:
        if token != IMAGE:
            out.append(token)
            continue
        sha, pieces = next(left)
        for piece in pieces:
            if isinstance(piece, list):
                out.extend(piece)
            else:
                out.images[len(out)] = piece
                out.extend(stand_ins(sha, len(piece)))
    if next(left, None) is not None:
        raise ValueError("more images than image parts")
    return out


def fetched(names: Sequence[str], get: Callable[[str], bytes | None]) -> list[tuple[str, bytes]]:
    """Each named image's bytes. Raises LookupError naming the first one gone (expired)."""
    out = []
    for name in names:
        data = get(name)
        if data is None:
            raise LookupError(name)
        out.append((name, data))
    return out
