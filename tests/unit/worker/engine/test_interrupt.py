"""The abort callback llama.cpp calls after every node of a step: libc's strlen on a flag."""

from __future__ import annotations

import ctypes

import pytest

pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it
from worker.engine.interrupt import ABORT_WHEN_SET


def test_the_callback_says_go_on_until_the_flag_is_raised_and_again_once_lowered():
    flag = ctypes.create_string_buffer(2)
    data = ctypes.cast(flag, ctypes.c_void_p)
    assert ABORT_WHEN_SET(data) is False
    flag[0] = b"x"
    assert ABORT_WHEN_SET(data) is True
    flag[0] = b"\0"
    assert ABORT_WHEN_SET(data) is False
