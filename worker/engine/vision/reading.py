"""Reading a step's images: each image's embeddings in decodes of their own (a llama.cpp batch
holds tokens or embeddings, not both), into its sequence's own KV positions, before the step's
tokens (worker/engine/batching.py)."""

from __future__ import annotations

from contract.stats import BatchCounters
from worker.engine.context import NativeContext
from worker.engine.steps.sequence import Sequence


def read_images(
    context: NativeContext, capacity: int, kv: list[list[int]], steps: list[Sequence], counters: BatchCounters
) -> int | None:
    """Decode the image rows each sequence of the step is at, `capacity` rows a decode, its
    slot's cache (`kv`) and its progress moved past them; a failed decode's code (the
    scheduler then ends every sequence), else None."""
    for seq in steps:
        while seq.pending is None and (rows := seq.images.get(seq.fed)) is not None:
            cache = kv[seq.slot]
            for start in range(0, len(rows), capacity):
                part = rows[start : start + capacity]
                context.interrupt.arm(False)
                if (rc := context.decode_embeddings(part, len(cache), seq.slot)) != 0:
                    return rc
                cache.extend(seq.context[seq.fed : seq.fed + len(part)])
                seq.fed += len(part)
                counters.prefill_tokens += len(part)
            if seq.progress is not None:
                seq.progress()
    return None
