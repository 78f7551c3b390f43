"""worker.engine.argmax: the pass split over threads gives one pass's answer, in row order."""

from __future__ import annotations

import numpy as np
import pytest

from worker.engine.argmax import MIN_SHARE, RowsArgmax, threads_for


@pytest.mark.parametrize(("rows", "vocab"), [(1, 10), (3, MIN_SHARE), (50, MIN_SHARE // 8 + 1)])
def test_any_split_gives_the_rows_argmax_in_order(rows, vocab):
    table = np.random.default_rng(rows).standard_normal((rows, vocab), dtype=np.float32)
    table[:, 0] = table.max(axis=1)  # ties: the first highest, as one pass takes it
    argmax = RowsArgmax(4)
    try:
        assert argmax(table) == table.argmax(axis=1).tolist()
    finally:
        argmax.close()


def test_a_small_step_stays_on_the_calling_thread():
    argmax = RowsArgmax(4)
    argmax._pool.shutdown()  # a share handed to the pool would now fail
    table = np.arange(64 * 1000, dtype=np.float32).reshape(64, 1000)
    assert argmax(table) == [999] * 64


def test_threads_are_half_the_cores_within_bounds():
    assert threads_for(1) == 1 and threads_for(2) == 1 and threads_for(16) == 8 and threads_for(64) == 8
