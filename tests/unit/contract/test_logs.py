"""JSON log lines carry the job id set for the current task or thread; no line says a URL's
password."""

from __future__ import annotations

import contextvars
import json
import logging

import pytest

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


def test_no_line_says_a_url_s_password_in_either_format():
    """redis-py, RQ, uvicorn and huggingface_hub may name a URL in what they log."""
    said = record("cannot reach redis://default:Sup3rSecretPW@cache:6379/0")
    try:
        raise ConnectionError("https://user:pw@mirror/api refused")
    except ConnectionError:
        import sys

        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "hub", (), sys.exc_info())
    for fmt in (logs.JSONFormatter(), logs._TextFormatter("%(levelname)s %(message)s")):
        for rec in (said, failed):
            line = fmt.format(rec)
            assert "Sup3rSecretPW" not in line and "user:pw@" not in line
        assert "default:***@cache" in fmt.format(said)


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("redis+cluster://user:Sup3rSecretPW@host:6379", "redis+cluster://user:***@host:6379"),
        ("REDIS_URL='rediss://:pw@h/0': no", "REDIS_URL='rediss://:***@h/0': no"),
        ("https://user:p@ss/w@mirror.example/api", "https://user:***@mirror.example/api"),
        (
            "redis+sentinel://s1,s2/m?ssl=true&sentinel_password=hunter2&x=1",
            "redis+sentinel://s1,s2/m?ssl=true&sentinel_password=***&x=1",
        ),
        ("https://hub.example/f?token=abc", "https://hub.example/f?token=***"),
        ("redis://host:6379/0 and user@example.org", "redis://host:6379/0 and user@example.org"),
    ],
)
def test_a_url_s_secrets_are_hidden_and_the_rest_kept(said, shown):
    assert logs.redacted(said) == shown
