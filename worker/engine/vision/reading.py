"""Reading a step's images, before the step's tokens (worker/engine/batching.py).

Each image's embeddings go in decodes of their own, into its sequence's own KV positions. A
llama.cpp batch holds tokens or embeddings, not both. While streams decode, a step reads one
image at most. An image's rows decode in one go (~0.4 s for 196 rows on two cores). A burst of
7 images read in one step kept a running stream 4.6 s without a token (bench/vision.py). One a
step keeps its gap to one image's decode."""

from __future__ import annotations

from contract.stats import BatchCounters
from worker.engine.context import NativeContext
from worker.engine.steps.sequence import Sequence


def read_images(
    context: NativeContext,
    capacity: int,
    kv: list[list[int]],
    steps: list[Sequence],
    counters: BatchCounters,
    most: int | None = None,
) -> int | None:
    """Decode the image rows each sequence of the step is at, `capacity` rows a decode.

    Its slot's cache (`kv`) and its progress move past them. It decodes `most` images in all
    (None: every one). Returns a failed decode's code, and the scheduler then ends every
    sequence. Else None. A sequence left at an image reads no text this step
    (`Sequence.text_left`)."""
    for seq in steps:
        while seq.pending is None and (rows := seq.images.get(seq.fed)) is not None:
            if most is not None:
                if most <= 0:
                    return None
                most -= 1
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
