"""worker/engine/llama_log.py: llama.cpp's log at the levels ggml numbers now (a continuation at its
line's level), what a stopped step logs by design as debug, and `install` routing llama.cpp's own
log there (a model file that is not there, no model needed)."""

from __future__ import annotations

import ctypes
import logging

import pytest

llama_cpp = pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it

from worker.engine import llama_log  # noqa: E402

NONE, DEBUG, INFO, WARN, ERROR, CONT = range(6)  # enum ggml_log_level


@pytest.fixture
def logged(caplog):
    """What the callback logged, as (level, line)."""
    caplog.set_level(logging.DEBUG, logger="llama.cpp")

    def read() -> list[tuple[int, str]]:
        return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "llama.cpp"]

    return read


def say(level: int, text: bytes) -> None:
    llama_log._to_logging(level, text, None)


def test_ggmls_levels_are_logged_at_their_own_level(logged):
    for level, text in [(NONE, b"n"), (DEBUG, b"d"), (INFO, b"i"), (WARN, b"w"), (ERROR, b"e"), (9, b"x")]:
        say(level, text)
    assert logged() == [
        (logging.DEBUG, "n"),
        (logging.DEBUG, "d"),
        (logging.DEBUG, "i"),  # llama.cpp's notices: not the worker's business above debug
        (logging.WARNING, "w"),
        (logging.ERROR, "e"),
        (logging.ERROR, "x"),  # a level ggml may add: not hidden
    ]


def test_a_continuation_is_logged_at_the_level_of_the_line_it_continues(logged):
    say(ERROR, b"failed to load:")
    say(CONT, b" no such file")
    say(CONT, b" (really)")
    say(INFO, b"loading")
    say(CONT, b"...")
    assert [level for level, _ in logged()] == [logging.ERROR] * 3 + [logging.DEBUG] * 2


@pytest.mark.parametrize(
    "line",
    [
        b"llama_memory_seq_rm: removing memory module entries for seq_id = 3, pos = [12, +inf)\n",
        b"graph_compute: ggml_backend_sched_graph_compute_async failed with error 1\n",
        b"decode: compute status: 1\n",
        b"llama_decode: failed to decode, ret = 2\n",
    ],
)
def test_what_a_stopped_step_logs_by_design_is_debug(logged, line):
    say(ERROR, line)
    say(WARN, line)
    assert [level for level, _ in logged()] == [logging.DEBUG, logging.DEBUG]


def test_other_failures_of_a_decode_are_still_errors(logged):
    say(ERROR, b"llama_decode: failed to decode, ret = -3\n")
    say(ERROR, b"decode: compute status: 4\n")
    assert [level for level, _ in logged()] == [logging.ERROR, logging.ERROR]


def test_lines_are_stripped_decoded_with_replacement_and_blank_ones_dropped(logged):
    say(WARN, b"  indented stays, trailing goes \n\n")
    say(WARN, b"\n")
    say(WARN, b"bad byte \xff here\n")
    assert logged() == [
        (logging.WARNING, "  indented stays, trailing goes"),
        (logging.WARNING, "bad byte \ufffd here"),
    ]


def test_levels_the_log_does_not_show_are_not_logged(caplog):
    caplog.set_level(logging.WARNING, logger="llama.cpp")
    say(INFO, b"a notice")
    say(CONT, b" continued")
    say(ERROR, b"llama_decode: failed to decode, ret = 2")
    say(WARN, b"a warning")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, "a warning")]


def test_install_routes_llama_cpps_own_log_through_the_workers(logged):
    llama_log.install()
    try:
        model = llama_cpp.llama_model_load_from_file(
            b"/nonexistent/model.gguf", llama_cpp.llama_model_default_params()
        )
    finally:  # llama-cpp-python's own callback back, as the rest of the process had it
        llama_cpp.llama_log_set(llama_cpp._logger.llama_log_callback, ctypes.c_void_p(0))
    assert model is None
    errors = [line for level, line in logged() if level == logging.ERROR]
    assert any("/nonexistent/model.gguf" in line for line in errors)
