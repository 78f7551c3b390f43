"""The OpenTelemetry SDK, set up from its own environment. It is the only module that imports
OpenTelemetry. It does so only when a process with tracing on calls it (contract/tracing/)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from contract.settings import SettingError
from contract.tracing.propagation import carry, enabled, replica, uncarry

log = logging.getLogger(__name__)


def tracer(default_service: str, name: str) -> Any:
    """The process's tracer (imports OpenTelemetry), or None when tracing is off. Its
    `service.name` is OTEL_SERVICE_NAME or the role's default. The sampler is OTEL_TRACES_SAMPLER's
    (parent-based always-on by default). Span ids may be chosen (`start_span`)."""
    if not enabled():
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    # asked for traces that cannot be sent: say so, do not drop them
    except ImportError as exc:
        raise SettingError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is missing ({exc.name}): "
            'pip install "tokenspool[tracing]", or unset it'
        ) from None

    class ChosenIds(RandomIdGenerator):
        """Random ids, but the one `start_span` chose for the span it starts on this thread."""

        def generate_span_id(self) -> int:
            chosen = _CHOSEN.__dict__.pop("span_id", None)
            return chosen or super().generate_span_id()

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: tokenspool exports http/protobuf only", protocol)
    service = os.environ.get("OTEL_SERVICE_NAME") or default_service
    resource = Resource.create({SERVICE_NAME: service, SERVICE_INSTANCE_ID: replica()})
    # sampler: OTEL_TRACES_SAMPLER
    provider = TracerProvider(resource=resource, id_generator=ChosenIds())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("tracing on: spans of %s go to OTLP/HTTP", service)
    return trace.get_tracer(name)


# the span id the next span this thread starts gets, if set
_CHOSEN = threading.local()


def start_span(tracer: Any, span_id: int, name: str, **options: Any) -> Any:
    """`tracer.start_span(name, **options)`, the span getting `span_id` (an attempt's:
    `attempt_span_id`; 0: a random one)."""
    _CHOSEN.span_id = span_id
    try:
        return tracer.start_span(name, **options)
    finally:
        # unused (a span not sampled): not the next one's
        _CHOSEN.__dict__.pop("span_id", None)


def context_of(trace_context: str) -> Any:
    """An OpenTelemetry context whose parent is the span `trace_context` names (tracing on)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent, state = uncarry(trace_context)
    return TraceContextTextMapPropagator().extract({"traceparent": parent, "tracestate": state})


def carried(span: Any) -> str:
    """A span's context as `JobSpec.trace_context` holds it (tracing on)."""
    c = span.get_span_context()
    return carry(f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}", c.trace_state.to_header())


def link_to(trace_id: int, span_id: int, sampled: bool = True, **attributes: Any) -> Any:
    """A link to the span with these ids (tracing on)."""
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return Link(SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags), attributes)
