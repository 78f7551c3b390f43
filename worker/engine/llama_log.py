"""llama.cpp's log, in the worker's own log at the right level.

The callback of llama-cpp-python maps ggml's levels by their old numbers, from before ggml
added DEBUG. It prints ggml's WARN as an error, and hides its ERROR as debug. So its
`set_verbose` cannot show llama.cpp's errors and hide its notices. This callback maps the
levels ggml numbers now. A stopped step (worker/engine/interrupt.py) logs lines that are
expected by design. So they are logged as debug. They are its status and the cells it leaves
removed. The cells take one line per sequence in the step. The status is 1 (aborted), and
`llama_decode` returns 2.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp

log = logging.getLogger("llama.cpp")

# enum ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_EXPECTED = (
    b"removing memory module entries",
    b"failed with error 1",
    b"compute status: 1",
    b"failed to decode, ret = 2",
)
_last = [logging.DEBUG]


@llama_cpp.llama_log_callback
def _to_logging(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    at = _last[0] if level == 5 else _LEVELS.get(level, logging.ERROR)
    _last[0] = at
    if at > logging.DEBUG and any(e in text for e in _EXPECTED):
        at = logging.DEBUG
    if log.isEnabledFor(at) and (line := text.decode("utf-8", "replace").rstrip()):
        log.log(at, line)


def install() -> None:
    """Route llama.cpp's log (every context and model of the process) through `log`."""
    llama_cpp.llama_log_set(_to_logging, ctypes.c_void_p(0))
