"""The argmax of a step's greedy rows, split over threads when the rows are many.

The pass over the logits is the one part of picking no worker can skip. One core does not
read memory as fast as the machine can. For Llama 3, 256 rows of 128,256 logits are 131 MB.
The GPU's copy has just written them, so they are not in any cache. NumPy lets go of the GIL
for the pass. So a few threads each take a share of the rows (`bench/step_overhead.py`
measures it). A share is at least `MIN_SHARE` logits. Below that, handing it to another thread
costs more than it saves. So the scheduler's thread reads a step of a few rows alone.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# logits (32 MiB): 64 rows of Llama 3's vocabulary, 170 of SmolLM2's
MIN_SHARE = 1 << 23
MAX_THREADS = 8


def threads_for(cores: int | None = None) -> int:
    """Threads for the pass: half this process's cores, at most MAX_THREADS.

    On a GPU worker the cores are otherwise idle while it picks. On a CPU worker, the step's
    llama.cpp threads are done by then."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, min(MAX_THREADS, cores // 2))


class RowsArgmax:
    """`rows.argmax(axis=1)` as a list, computed on up to `threads` threads.

    The caller's thread is one of them."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool = ThreadPoolExecutor(self.threads - 1, "argmax") if self.threads > 1 else None

    def __call__(self, rows: np.ndarray) -> list[int]:
        shares = min(self.threads, max(1, rows.size // MIN_SHARE), len(rows))
        if shares <= 1 or self._pool is None:
            return rows.argmax(axis=1).tolist()
        bounds = np.linspace(0, len(rows), shares + 1).astype(int).tolist()
        parts = [rows[a:b] for a, b in itertools.pairwise(bounds)]
        later = [self._pool.submit(np.argmax, part, 1) for part in parts[1:]]
        out = parts[0].argmax(axis=1).tolist()
        for future in later:
            out += future.result().tolist()
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
