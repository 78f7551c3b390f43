"""worker/engine/vision/reading.py: a step's images decoded before its tokens, each sequence's
cache moved past them; while a stream decodes, one image a step at most."""

from __future__ import annotations

import numpy as np

from contract.stats import BatchCounters
from worker.engine.steps.sequence import Sequence
from worker.engine.vision.reading import read_images


class _Interrupt:
    def arm(self, stoppable: bool) -> None:
        pass


class _Context:
    """A stand-in for NativeContext that records each embedding decode."""

    def __init__(self) -> None:
        self.interrupt = _Interrupt()
        self.decodes: list[tuple[int, int, int]] = []  # (slot, position, rows)

    def decode_embeddings(self, rows: np.ndarray, position: int, slot: int) -> int:
        self.decodes.append((slot, position, len(rows)))
        return 0


def _at_image(slot: int, rows: int = 6) -> Sequence:
    """A sequence of 2 text tokens read, then an image of `rows` rows, then text."""
    seq = Sequence(context=[1, 2, *[0] * rows, 3], sampler=None, room=8, slot=slot, fed=2)  # type: ignore[arg-type]
    seq.images = {2: np.zeros((rows, 4), dtype=np.float32)}
    return seq


def test_every_image_of_the_step_is_read_before_its_tokens_in_decodes_of_capacity():
    context, kv, counters = _Context(), [[1, 2], [1, 2]], BatchCounters()
    a, b = _at_image(0), _at_image(1)
    assert read_images(context, 4, kv, [a, b], counters) is None  # type: ignore[arg-type]
    assert context.decodes == [(0, 2, 4), (0, 6, 2), (1, 2, 4), (1, 6, 2)]
    assert (a.fed, b.fed, len(kv[0]), counters.prefill_tokens) == (8, 8, 8, 12)
    assert a.text_left() == 1


def test_beside_a_decoding_stream_a_step_reads_one_image():
    context, kv = _Context(), [[1, 2], [1, 2], [5]]
    a, b = _at_image(0), _at_image(1)
    stream = Sequence(context=[5], sampler=None, room=8, slot=2, fed=1, pending=9)  # type: ignore[arg-type]
    read_images(context, 512, kv, [a, b, stream], BatchCounters(), most=1)  # type: ignore[arg-type]
    assert context.decodes == [(0, 2, 6)]
    assert b.fed == 2 and b.text_left() == 0  # it waits at its image: no text of it this step
    read_images(context, 512, kv, [a, b, stream], BatchCounters(), most=1)  # type: ignore[arg-type]
    assert context.decodes[-1] == (1, 2, 6)
