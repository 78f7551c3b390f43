"""worker.engine.context's batch: llama.cpp's struct points at the arrays a step fills."""

from __future__ import annotations

import ctypes

import pytest

pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it
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


class FakeLlama:
    """The llama.cpp calls a slot's cache makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def install(self, monkeypatch) -> None:
        import worker.engine.context as context
        import worker.engine.interrupt as interrupt

        for name in ("llama_memory_seq_cp", "llama_memory_seq_rm", "llama_decode"):
            monkeypatch.setattr(context.llama_cpp, name, self._record(name))
        monkeypatch.setattr(context.llama_cpp, "llama_get_memory", lambda ctx: "mem")
        monkeypatch.setattr(interrupt.llama_cpp, "llama_set_abort_callback", lambda *a: None)
        monkeypatch.setattr(context.llama_cpp, "llama_state_seq_get_size", lambda ctx, seq: 4)
        monkeypatch.setattr(context.llama_cpp, "llama_state_seq_get_data", self._record("get", 4))
        monkeypatch.setattr(context.llama_cpp, "llama_state_seq_set_data", self._record("set", 4))

    def _record(self, name: str, result: int = 0):
        def call(*args):
            self.calls.append((name, *[a for a in args if isinstance(a, int)]))
            return result

        return call


def test_a_prefix_is_copied_cell_by_cell_unless_a_queued_whole_slot_copy_touches_its_slots(monkeypatch):
    from worker.engine.context import NativeContext

    llama = FakeLlama()
    llama.install(monkeypatch)
    ctx = NativeContext("ctx", 8)
    ctx.copy_prefix(0, 1, 30)  # now, through the sequence state; cut to the prefix
    assert llama.calls == [("get", 4, 0), ("set", 4, 1), ("llama_memory_seq_rm", 1, 30, -1)]
    llama.calls.clear()
    ctx.copy(2, 3)  # a move: llama.cpp copies slot 2 into 3 at the next decode
    ctx.copy_prefix(3, 4, 10)  # a copy now would read slot 3 before the move wrote it: queued
    ctx.copy_prefix(5, 2, 10)  # or write slot 2 before the move read it
    ctx.copy_prefix(6, 7, 10)  # slots no queued copy touches: now
    assert [c[0] for c in llama.calls] == [
        "llama_memory_seq_cp",
        "llama_memory_seq_cp",
        "llama_memory_seq_rm",
        "llama_memory_seq_cp",
        "llama_memory_seq_rm",
        "get",
        "set",
        "llama_memory_seq_rm",
    ]
    ctx.decode(StepBatch(1))  # the queued copies ran first
    llama.calls.clear()
    ctx.copy_prefix(3, 4, 10)
    assert [c[0] for c in llama.calls] == ["get", "set", "llama_memory_seq_rm"]
    llama.calls.clear()
    ctx.kv_on_device = True  # in a GPU's memory: the whole slot, queued
    ctx.copy_prefix(0, 1, 30)
    assert llama.calls == [("llama_memory_seq_cp", 0, 1, -1, -1), ("llama_memory_seq_rm", 1, 30, -1)]
