"""JSON log lines carry the job id set for the current task or thread."""

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
        logs.set_job("chatcmpl-abc")
        return json.loads(fmt.format(record('hello "x"')))

    line = contextvars.copy_context().run(tagged)
    assert line["completion_id"] == "chatcmpl-abc" and line["msg"] == 'hello "x"'
    assert line["level"] == "info" and line["logger"] == "tokenspool.test"
    untagged = contextvars.copy_context().run(lambda: json.loads(fmt.format(record("idle"))))
    assert "completion_id" not in untagged


def test_a_text_line_cannot_be_forged_by_what_a_message_carries():
    """A model name or a path is the client's own text: a newline in it must not start a
    line of its own in a text log (the security review)."""
    fmt = logs._TextFormatter("%(levelname)s %(message)s")
    forged = record("enqueued for m\nINFO api admin logged in\r\x1b[2J")
    line = fmt.format(forged)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "\\nINFO api admin logged in" in line
