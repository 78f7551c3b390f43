"""A pooled embedding as a client gets it, in float32. It is cut to the dimensions asked for
(a Matryoshka model's leading ones). It is L2-normalised as OpenAI's and llama-server's are."""

from __future__ import annotations

import numpy as np


def finish(vector: np.ndarray, dimensions: int = 0) -> np.ndarray:
    """The first `dimensions` values (0: all), scaled to unit length. A zero vector stays zero."""
    cut = np.asarray(vector[:dimensions] if dimensions else vector, dtype=np.float64)
    norm = float(np.linalg.norm(cut))
    return (cut / norm if norm > 0 else cut).astype("<f4")


def pack(vectors: list[np.ndarray]) -> bytes:
    """Vectors one after another, float32 little-endian: `contract.entries.Finished.vectors`."""
    return b"".join(v.astype("<f4").tobytes() for v in vectors)
