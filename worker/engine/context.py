"""llama.cpp's context as the batching scheduler drives it.

It writes a step's rows as arrays and runs one decode. It reads the step's logits once, and
handles the slots' caches.

Each field of each row written into llama.cpp's own batch costs a ctypes call. So does each
row's logits read with `llama_get_logits_ith`. Each call lets go of the GIL and takes it
back. A job thread may take it meanwhile. Then the scheduler waits, up to the interpreter's
switch interval. All that time the GPU has nothing to do. Here the batch's fields are
numpy arrays that llama.cpp reads in place (`StepBatch`). A step's logits are one (rows,
vocabulary) array behind one synchronisation (`NativeContext.logits`). It holds the rows
that asked for logits, in batch order, as `llama_get_logits` documents them.

`bench/step_overhead.py` drives the scheduler through a stand-in with the same methods. The
stand-in's decode takes a set time, and its logits have a set vocabulary. So the bench
measures the worker's own work per step.
"""

from __future__ import annotations

import ctypes
import mmap

import llama_cpp
import numpy as np

from worker.engine.interrupt import StepInterrupt


class StepBatch:
    """A `llama_batch` whose fields are numpy arrays owned here, one sequence id a row.
    Never given to `llama_batch_free`: its memory is Python's."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        self._n_seq_id = np.ones(capacity, dtype=np.int32)
        one = ctypes.POINTER(llama_cpp.llama_seq_id)
        # row i's sequence ids: one, at seq[i] (llama.cpp reads seq_id[i][0])
        self._seq_ids = np.arange(capacity + 1, dtype=np.uintp) * self.seq.itemsize + self.seq.ctypes.data
        # llama_batch_init ends the list with NULL too
        self._seq_ids[-1] = 0
        self.native = llama_cpp.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token)),
            embd=None,
            pos=self.pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos)),
            n_seq_id=self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=self._seq_ids.ctypes.data_as(ctypes.POINTER(one)),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self.rows = 0

    def fill(self, tokens: list[int], positions: list[int], slots: list[int], logits: list[bool]) -> None:
        """The step's rows, in batch order."""
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"{n} rows in a batch of {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = positions
        self.seq[:n] = slots
        self.logits[:n] = logits
        self.native.n_tokens = self.rows = n


class NativeContext:
    """One llama.cpp context: what a step and the slots' caches ask of it."""

    def __init__(self, ctx, n_vocab: int, kv_on_device: bool = False) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab
        # the KV cache is in a GPU's memory (see copy_prefix)
        self.kv_on_device = kv_on_device
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.interrupt = StepInterrupt(ctx)
        # slots a whole-slot copy not yet run reads or writes
        self._queued: set[int] = set()

    def decode(self, batch: StepBatch) -> int:
        """llama_decode's code: 0, 2 when the interrupt stopped it, else a failure. On a GPU it
        may return while the step still computes: `logits` waits for it."""
        rc = llama_cpp.llama_decode(self.ctx, batch.native)
        # llama.cpp ran the queued copies first (it refuses a bad batch before)
        if rc >= 0:
            self._queued.clear()
        return rc

    def decode_embeddings(self, rows: np.ndarray, position: int, slot: int) -> int:
        """One decode of embeddings into slot `slot`'s cache, from `position` on, asking no logits.

        The embeddings are an image's rows (rows x n_embd floats). The result is llama_decode's
        code (0: read)."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n, width = rows.shape
        batch = llama_cpp.llama_batch_init(n, width, 1)
        try:
            ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
            for i in range(n):
                batch.pos[i] = position + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = slot
                batch.logits[i] = 0
            batch.n_tokens = n
            rc = llama_cpp.llama_decode(self.ctx, batch)
        finally:
            llama_cpp.llama_batch_free(batch)
        if rc >= 0:
            self._queued.clear()
        return rc

    def logits(self, rows: int) -> np.ndarray:
        """The last step's logits, a (rows, vocabulary) view of llama.cpp's buffer.

        It is valid until the next decode. It holds the rows that asked for logits, in batch
        order."""
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        address = ctypes.addressof(llama_cpp.llama_get_logits(self.ctx).contents)
        flat = (ctypes.c_float * (rows * self.n_vocab)).from_address(address)
        return np.frombuffer(flat, dtype=np.float32).reshape(rows, self.n_vocab)

    def remove(self, slot: int, start: int = 0) -> None:
        """Slot `slot`'s cache from position `start` on."""
        llama_cpp.llama_memory_seq_rm(self._mem, slot, start, -1)

    def copy(self, src: int, dst: int) -> None:
        """Slot `src`'s whole cache into `dst` (llama.cpp copies it at the next decode)."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, -1, -1)
        self._queued.update((src, dst))

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """The first `length` positions of slot `src`'s cache into `dst`, over what `dst` held.

        `src` is left whole. With a cache split by sequence, llama.cpp copies between slots
        only whole. Its `seq_cp` queues a copy of the entire slot buffer for the next decode.
        The buffer is N_CTX cells of every layer. In a GPU's memory that is fast. On a CPU it
        is a memcpy of the whole slot. For SmolLM2 at N_CTX=4096 that is ~90 MB, tens of ms.
        So on a CPU the cells `src` holds are copied now, through llama.cpp's sequence state.
        That costs ~5 us a cell. Not so when a queued whole-slot copy reads or writes either
        slot. That copy would run after this one. Either way the copy is then cut to
        `length`."""
        if self.kv_on_device or not self._copy_cells(src, dst):
            self.copy(src, dst)
        llama_cpp.llama_memory_seq_rm(self._mem, dst, length, -1)

    def _copy_cells(self, src: int, dst: int) -> bool:
        if src in self._queued or dst in self._queued:
            return False
        size = llama_cpp.llama_state_seq_get_size(self.ctx, src)
        state = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(self.ctx, state, size, src) != size:
            return False
        return llama_cpp.llama_state_seq_set_data(self.ctx, state, size, dst) == size

    def queued(self, slot: int) -> bool:
        """Whether a whole-slot copy not yet run reads or writes `slot`.

        If so, its cells must not be read or written before the next decode runs it."""
        return slot in self._queued

    def save(self, slot: int) -> mmap.mmap | None:
        """Slot `slot`'s whole sequence as llama.cpp serialises it: its cells and their positions.

        It is for the host tier (worker/engine/cache/tier.py). On a GPU it is a copy from the
        device. It lives in pages of its own. A dropped state goes back to the system at once,
        not into malloc's heap. So the tier's bound holds the process's memory. None when
        llama.cpp wrote less than it said. None too when a queued whole-slot copy reads or
        writes the slot. Its cells are then not yet what the scheduler says."""
        if self.queued(slot):
            return None
        size = llama_cpp.llama_state_seq_get_size(self.ctx, slot)
        state = mmap.mmap(-1, size)
        buffer = (ctypes.c_uint8 * size).from_buffer(state)
        return state if llama_cpp.llama_state_seq_get_data(self.ctx, buffer, size, slot) == size else None

    def restore(self, slot: int, state: mmap.mmap | bytearray) -> bool:
        """A saved sequence into `slot`, in place of what it held.

        False: llama.cpp refused it, and the slot may hold nothing. Never while `queued(slot)`."""
        size = len(state)
        buffer = (ctypes.c_uint8 * size).from_buffer(state)
        return llama_cpp.llama_state_seq_set_data(self.ctx, buffer, size, slot) == size

    def clear(self) -> None:
        """Every slot's cache, its buffers written over."""
        llama_cpp.llama_memory_clear(self._mem, True)
