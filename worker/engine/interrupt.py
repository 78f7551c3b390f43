"""Stop a `llama_decode` in the middle, from another thread, without the GIL.

A step of Batch API lines may be computing when an interactive job arrives. The job should
not wait for that step. It takes tens of milliseconds on a CPU, more the more rows it has.
So the scheduler gives the context an abort callback, and a job thread raises the flag. The
CPU backend of llama.cpp calls the callback after every node of the graph. So it stops the
step within one node. `llama_decode` returns 2 and has taken the step's tokens out of the KV
cache. Then worker.engine.batching rolls back its own record of them and plans the step again.

The callback is called hundreds of times a step from inside the graph computation. So it
must not be Python: a ctypes callback would take the GIL at every node. It would then wait
behind the job threads. The callback is libc's `strlen` on a two-byte buffer. `strlen(data)`
is 0 (go on) while the buffer holds b"\\0". It is 1 (abort) once the first byte is set. The
C ABI returns a `bool` in the low byte of the return register. That is where `strlen`'s 0 or
1 sits. GPU backends do not call the callback. There a step runs to its end, as before.
"""

from __future__ import annotations

import ctypes
import threading

import llama_cpp

ABORT_WHEN_SET = llama_cpp.ggml_abort_callback(
    # the process's C library
    ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
)
"""The callback: true once the first byte of its data is not zero."""


class StepInterrupt:
    """One context's abort flag.

    `arm` it before a step that may be cut short, and `fire` it from any thread. After the
    step, `take` says whether it was cut."""

    def __init__(self, ctx) -> None:
        # b"\0\0": strlen 0
        self._flag = ctypes.create_string_buffer(2)
        self._armed = False
        # a `fire` never lands on a step armed after it looked
        self._lock = threading.Lock()
        llama_cpp.llama_set_abort_callback(ctx, ABORT_WHEN_SET, ctypes.cast(self._flag, ctypes.c_void_p))

    def arm(self, armed: bool) -> None:
        """Before a step: whether `fire` may stop it. The flag is lowered either way."""
        with self._lock:
            self._flag[0] = b"\0"
            self._armed = armed

    def fire(self) -> bool:
        """Stop the step in flight if it is armed. True if it is.

        A step that ends meanwhile is not cut, and `take` says it was not."""
        with self._lock:
            if self._armed:
                self._flag[0] = b"x"
            return self._armed

    def take(self) -> bool:
        """After a step: whether the flag was raised (and lower it)."""
        with self._lock:
            raised = self._flag[0] != b"\0"
            self._flag[0] = b"\0"
            self._armed = False
            return raised
