"""The propagation format both sides share. It covers W3C trace contexts as a job carries them, and
the span ids every process gives an attempt. Standard library only."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Mapping

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# W3C: 32 members of at most 256 characters; longer ones are dropped
MAX_TRACESTATE = 512
API_SERVICE, WORKER_SERVICE = "tokenspool-api", "tokenspool-worker"


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether OpenTelemetry's environment turns tracing on."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def parse(traceparent: str) -> tuple[int, int, int] | None:
    """A W3C traceparent's trace id, parent span id and flags. None if it is not one. An all-zero id
    is invalid too."""
    match = TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    trace_id, span_id, flags = (int(g, 16) for g in match.groups())
    return (trace_id, span_id, flags) if trace_id and span_id else None


def carry(traceparent: str, tracestate: str = "") -> str:
    """A span's context as `JobSpec.trace_context` holds it."""
    state = tracestate if len(tracestate) <= MAX_TRACESTATE and "\n" not in tracestate else ""
    return f"{traceparent}\n{state}" if state else traceparent


def uncarry(trace_context: str) -> tuple[str, str]:
    """`JobSpec.trace_context` back as (traceparent, tracestate)."""
    parent, _, state = trace_context.partition("\n")
    return parent, state


def valid(trace_context: str) -> bool:
    """Whether a job's trace context is one `carry` writes. ("": the job is not traced.)"""
    if not trace_context:
        return True
    parent, state = uncarry(trace_context)
    return parse(parent) is not None and len(state) <= MAX_TRACESTATE and "\n" not in state


def attempt_span_id(trace_id: int, job_id: str, epoch: int) -> int:
    """The span id of attempt `epoch` of a job in a trace. It is the same for every process."""
    seed = hashlib.sha256(f"{trace_id:032x} {job_id} {epoch}".encode()).digest()
    return int.from_bytes(seed[:8], "big") or 1


def replica() -> str:
    """This process's name in spans: its host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"
