"""worker.engine.context's batch: llama.cpp's struct points at the arrays a step fills."""

from __future__ import annotations

import ctypes

import pytest

from worker.engine.context import StepBatch


def test_a_filled_batch_reads_as_llama_cpp_reads_it():
    batch = StepBatch(8)
    batch.fill([11, 12, 13], [0, 5, 6], [2, 0, 0], [False, True, True])
    native = batch.native
    assert native.n_tokens == batch.rows == 3
    assert [native.token[i] for i in range(3)] == [11, 12, 13]
    assert [native.pos[i] for i in range(3)] == [0, 5, 6]
    assert [native.n_seq_id[i] for i in range(3)] == [1, 1, 1]
    assert [native.seq_id[i][0] for i in range(3)] == [2, 0, 0]
    assert [native.logits[i] for i in range(3)] == [0, 1, 1]
    assert not native.embd
    assert ctypes.cast(native.seq_id[8], ctypes.c_void_p).value is None  # ends with NULL


def test_a_step_larger_than_the_batch_is_refused():
    with pytest.raises(ValueError, match="4 rows in a batch of 3"):
        StepBatch(3).fill([1] * 4, [0] * 4, [0] * 4, [True] * 4)
