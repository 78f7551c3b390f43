"""An image in a job: its place in a message's content, its name, and what its bytes are.

The API turns each image part of a request into `MARKER` at its place in the message's text. It
stores the image's bytes in Redis under their SHA-256 (`contract.keys.image`, within the job's
cache scope). It lists the hashes in the job spec's `images`, in the order their markers come.
`low_detail` lists those a part asked read at `detail: low`. A worker with an mmproj reads each
marker as that image (llama.cpp's mtmd, whose default media marker this is). A request whose own
text holds the marker is refused, since no client text can stand for an image.
"""

from __future__ import annotations

import random
import re
import struct
import zlib
from collections.abc import Iterable, Sequence

# mtmd_default_marker()
MARKER = "<__media__>"
# `detail: low`: the image shrunk to fit a square this many pixels a side
LOW_DETAIL_SIDE = 512
SHA256 = re.compile(r"[0-9a-f]{64}")
FORMATS = ("png", "jpeg", "webp", "gif")


def kind(data: bytes) -> str | None:
    """Which of FORMATS the bytes are, by their signature (None: none of them)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    return None


def problem(images: object, contents: Iterable[str], kind: str, low_detail: object = ()) -> str | None:
    """What is wrong with a spec's `images` (None: nothing). They must be SHA-256 hex names, on a
    chat job, as many as the markers in its messages. `low_detail` holds increasing indices of them."""
    if not isinstance(images, tuple) or not all(isinstance(h, str) and SHA256.fullmatch(h) for h in images):
        return "images must be SHA-256 hex digests"
    if images and kind != "chat":
        return "images are for chat jobs"
    markers = sum(text.count(MARKER) for text in contents) if images else 0
    if markers != len(images):
        return f"{len(images)} images for {markers} image markers"
    if not isinstance(low_detail, tuple) or not all(type(i) is int for i in low_detail):
        return "low_detail must be image indices"
    if list(low_detail) != sorted(set(low_detail)) or any(not 0 <= i < len(images) for i in low_detail):
        return f"low_detail must be increasing indices of the {len(images)} images"
    return None


def names(images: Sequence[str], low_detail: Sequence[int]) -> list[str]:
    """Each image as a model reads it: its hash, with `:low` where it is read at low detail. Low
    detail means other pixels, so other embeddings and another prompt prefix."""
    low = set(low_detail)
    return [sha + ":low" if i in low else sha for i, sha in enumerate(images)]


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of random RGB pixels, written without an image library. It is the worker's probe image
    at start, and the tests'."""
    return png_of(random.Random(seed).randbytes(width * height * 3), width, height)


def png_of(pixels: bytes, width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of `pixels` (rows top to bottom, 3 bytes a pixel)."""
    raw = b"".join(b"\x00" + pixels[y * width * 3 : (y + 1) * width * 3] for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    # 8-bit RGB, filter 0 each row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
