"""JSON log lines carry the completion id set for the current task or thread."""

from __future__ import annotations

import contextvars
import json
import logging

from contract import logs


def record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("tokenspool.test", logging.INFO, __file__, 1, msg, (), None)


def test_json_line_with_and_without_completion_id():
    fmt = logs.JSONFormatter()

    def tagged() -> dict:
        logs.set_completion("chatcmpl-abc")
        return json.loads(fmt.format(record('hello "x"')))

    line = contextvars.copy_context().run(tagged)
    assert line["completion_id"] == "chatcmpl-abc" and line["msg"] == 'hello "x"'
    assert line["level"] == "info" and line["logger"] == "tokenspool.test"
    untagged = contextvars.copy_context().run(lambda: json.loads(fmt.format(record("idle"))))
    assert "completion_id" not in untagged
