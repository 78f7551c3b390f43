"""The log format both sides share: one JSON object per line, carrying the job id.

The API sets the job id when it creates or opens a job. The worker sets it when it starts an
attempt. Every line logged meanwhile carries it as `completion_id`. It has been the field's
name since the first release, and log queries rely on it. So one query follows a request to
the worker that generated it and back. `LOG_FORMAT=text` gives plain lines for a terminal.
Prompts and completions are never logged. Nor is a URL's password (`redacted`), whoever logs
the URL. That may be a start-up refusal, or a library's connection error. Redis, Sentinel and
a Hub mirror's HF_ENDPOINT URLs may carry one.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contract.settings import Shared

_job: contextvars.ContextVar[str] = contextvars.ContextVar("job_id", default="")

# scheme://user:password@ (the password up to the last "@" before a space: a raw "@" in it
# is cut there, not shown)
_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:@/\s]*:)[^\s]*@", re.IGNORECASE)
_SECRET_QUERY = re.compile(r"(?P<head>[?&;][a-z_]*(?:password|token|secret|key)=)[^&#\s'\"]*", re.IGNORECASE)


def redacted(text: str) -> str:
    """`text` with every URL password and secret query value shown as ***.

    A secret query value is a `sentinel_password=` or a `token=`."""
    return _SECRET_QUERY.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>***@", text))


def set_job(job_id: str) -> None:
    """Tag what this task or thread logs from now on with `job_id`."""
    _job.set(job_id)


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redacted(record.getMessage()),
        }
        job_id = _job.get()
        if job_id:
            out["completion_id"] = job_id
        if record.exc_info:
            out["exc"] = redacted(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    """One line per record, whatever a message carries (a model name, a path).

    Line breaks and other control characters are escaped. So a request cannot forge log lines."""

    def format(self, record: logging.LogRecord) -> str:
        line = redacted(super().format(record))
        job_id = _job.get()
        line = f"{line} [{job_id}]" if job_id else line
        return line.translate(_ESCAPES)


# control characters but tab, as the escapes a Python string literal would show
_ESCAPES = {c: repr(chr(c))[1:-1] for c in (*range(0x20), 0x7F) if c != 0x09}


def configure(process: str, settings: Shared) -> None:
    """Send every log line (ours, uvicorn's, RQ's) to stderr in the chosen format."""
    if settings.log_format == "json":
        formatter: logging.Formatter = JSONFormatter()
    else:
        formatter = _TextFormatter(f"%(asctime)s %(levelname)s {process} %(name)s %(message)s")
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        # uvicorn's own handlers (none for the access log if disabled)
        if logger.handlers:
            logger.handlers[:] = [handler]
