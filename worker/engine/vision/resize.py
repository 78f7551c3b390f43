"""`detail: low`, as numpy does it. An image's decoded pixels are shrunk to fit a square of
LOW_DETAIL_SIDE pixels, before the mmproj reads them. Its own resize then runs as ever. Each
new pixel is the mean of the source pixels it covers (an area filter). So no image library is
needed, and a screenshot's text blurs instead of aliasing."""

from __future__ import annotations

import numpy as np


def fitted(width: int, height: int, side: int) -> tuple[int, int]:
    """The size an image of `width` x `height` is shrunk to. It stays as is where it fits in a
    square of `side`. Else its longer side is made `side`, its aspect kept (at least one pixel
    a side)."""
    longer = max(width, height)
    if longer <= side:
        return width, height
    return max(1, round(width * side / longer)), max(1, round(height * side / longer))


def shrunk(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """`pixels` (rows x columns x channels, uint8) shrunk to `height` x `width` by an area
    filter. Neither may be larger than the source's."""
    rows, cols = pixels.shape[:2]
    assert width <= cols and height <= rows, "shrunk only shrinks"
    ys = np.linspace(0, rows, height + 1).round().astype(np.intp)
    xs = np.linspace(0, cols, width + 1).round().astype(np.intp)
    sums = np.add.reduceat(np.add.reduceat(pixels, ys[:-1], axis=0, dtype=np.uint32), xs[:-1], axis=1)
    counts = np.diff(ys)[:, None, None] * np.diff(xs)[None, :, None]
    return ((sums + counts // 2) // counts).astype(np.uint8)
