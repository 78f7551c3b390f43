"""Traces (OpenTelemetry), off by default: what the API and the worker share.

Tracing is on when OpenTelemetry's own environment names an exporter endpoint and
`OTEL_SDK_DISABLED` is not true. The endpoint is `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`. Spans then go over OTLP/HTTP (protobuf) through the batch span
processor. The export runs on its own thread, never on a request's or the decoder's. OpenTelemetry
is an optional extra (`pip install tokenspool[tracing]`). Only `otel.py` imports it, and only when
tracing is on. So a process without it imports nothing of it. `propagation.py` is the format both
sides share, in the standard library.

A request's trace travels with its job as `JobSpec.trace_context`. It holds the W3C `traceparent` of
the API's span, then a newline and its `tracestate` if it has one. Every attempt's span id is
derived from its trace, job and epoch (`propagation.attempt_span_id`). So whoever finds an attempt
dead (the API's reaper) can close its span. The next attempt can link to it too, with nothing more
stored.
"""
