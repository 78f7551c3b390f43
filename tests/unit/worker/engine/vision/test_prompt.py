"""worker/engine/vision/prompt.py: an image's pieces in place of its IMAGE, its rows by position."""

import numpy as np
import pytest

from worker.engine.vision.prompt import IMAGE, expand, fetched, stand_ins

A, B = "a" * 64, "b" * 64


def test_each_image_takes_its_place_with_its_text_ids_and_its_rows_stand_ins():
    rows = np.zeros((3, 4), dtype=np.float32)
    prompt = expand([5, IMAGE, 6, IMAGE], [(A, [[90], rows, [91]]), (B, [rows[:2]])])
    assert list(prompt) == [5, 90, *stand_ins(A, 3), 91, 6, *stand_ins(B, 2)]
    assert sorted(prompt.images) == [2, 7] and prompt.images[2] is rows
    assert all(t < 0 for t in stand_ins(A, 3)) and stand_ins(A, 3) != stand_ins(B, 3)


def test_a_prompt_without_images_is_its_ids_and_extra_images_are_an_error():
    assert list(expand([1, 2], [])) == [1, 2] and expand([1, 2], []).images == {}
    with pytest.raises(ValueError):
        expand([1], [(A, [])])


def test_an_image_gone_from_redis_is_named():
    store = {A: b"x"}
    assert fetched([A], store.get) == [(A, b"x")]
    with pytest.raises(LookupError, match=B):
        fetched([A, B], store.get)
