"""The API's traces (contract/tracing/): one SERVER span per request that makes or follows a
job. Their names and attributes follow OpenTelemetry's GenAI conventions (`gen_ai.*`). They
also follow tokenspool's own (`tokenspool.*`, docs/operations.md "Tracing").

`TraceMiddleware` gives each request a `RequestTrace`. It is installed only when tracing is
on. The request's route opens the span once it knows what the request is (`open`). The
middleware ends it after the response's last byte, so a stream's span lasts as long as the
stream. With tracing off, `trace_of` gives every request `OFF`, whose methods do nothing.
The hot path calls them only once a request, never once a token.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract.entries import Entry, Failed, Finished
from contract.tracing import otel, propagation

SCOPE_KEY = "tokenspool.trace"
# else chat
OPERATIONS = {"chat": "chat", "text": "text_completion", "embeddings": "embeddings"}


class RequestTrace:
    """One request's span: opened by its route (`open`), ended by the middleware."""

    on = True

    def __init__(self, tracer: Any, method: str, headers: dict[str, str]) -> None:
        self._tracer, self._method = tracer, method
        self._parent = headers.get("traceparent", "")
        self._state = headers.get("tracestate", "")
        # the span starts with the request, before its body is read
        self._arrived_ns = time.time_ns()
        self.span: Any = None

    def open(
        self, endpoint: str, model: str, job_id: str, joins: str | None = None, **attributes: Any
    ) -> None:
        """Open the request's span, in the client's trace (its `traceparent`) or a new one.
        A request may follow a job made earlier: a resume, a retry, a cancel. Such a request
        `joins` the trace of the request that made it ("": that job is not traced). It links
        to its own client's trace, if it sent one."""
        own = self._parent if propagation.parse(self._parent) else ""
        carried = joins or (propagation.carry(own, self._state) if own else "")
        links = []
        if joins and own:
            trace_id, span_id, flags = propagation.parse(own)  # type: ignore[misc]
            links.append(otel.link_to(trace_id, span_id, bool(flags & 1), **{"tokenspool.link": "client"}))
        operation = OPERATIONS.get(endpoint, "chat")
        from opentelemetry.trace import SpanKind

        self.span = self._tracer.start_span(
            f"{operation} {model}",
            context=otel.context_of(carried) if carried else None,
            kind=SpanKind.SERVER,
            start_time=self._arrived_ns,
            links=links,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.request.model": model,
                "gen_ai.response.id": job_id,
                "tokenspool.endpoint": endpoint,
                "tokenspool.follows": joins is not None,
                "http.request.method": self._method,
                **{f"tokenspool.{k}": v for k, v in attributes.items() if v not in (None, "")},
            },
        )

    def note(self, **attributes: Any) -> None:
        """Attributes learnt on the way (`tokenspool.<name>`)."""
        if self.span is not None:
            self.span.set_attributes({f"tokenspool.{k}": v for k, v in attributes.items()})

    def event(self, name: str) -> None:
        """A moment of the request: "enqueued", "first token sent". These show where a first
        token's time goes (bench/hops.py)."""
        if self.span is not None:
            self.span.add_event(name)

    def carried(self) -> str:
        """The span's context for the job's spec ("": no span)."""
        return otel.carried(self.span) if self.span is not None else ""

    def relayed(self, after: str) -> None:
        """This replica relays the job's stream from entry `after`."""
        if self.span is not None:
            replica = propagation.replica()
            self.span.add_event("relay", {"tokenspool.replica": replica, "tokenspool.after": after})

    def ended(self, end: Entry | None, first_id: str = "", arrived_ms: int = 0, ttft_s: float = 0.0) -> None:
        """What the job came to, once its client has it: usage, finish reason, queue wait,
        TTFT. The queue wait runs from the request's arrival to its first attempt's Started
        entry (`first_id`)."""
        span = self.span
        if span is None:
            return
        if isinstance(end, Finished):
            span.set_attribute("gen_ai.usage.input_tokens", end.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", end.completion_tokens)
            span.set_attribute("gen_ai.response.finish_reasons", [end.finish_reason])
            span.set_attribute("tokenspool.cached_tokens", end.cached_tokens)
        elif isinstance(end, Failed):
            from opentelemetry.trace import StatusCode

            span.set_attribute("error.type", end.code)
            span.set_status(StatusCode.ERROR, end.message)
        if first_id and arrived_ms:
            queued = int(first_id.split("-")[0]) - arrived_ms
            span.set_attribute("tokenspool.queue_wait_ms", max(queued, 0))
        if ttft_s:
            span.set_attribute("tokenspool.ttft_ms", round(ttft_s * 1000, 3))


class Off:
    """Tracing off: every call does nothing."""

    on = False
    span = None

    def open(self, *args: Any, **kwargs: Any) -> None:
        pass

    def note(self, **attributes: Any) -> None:
        pass

    def event(self, name: str) -> None:
        pass

    def carried(self) -> str:
        return ""

    def relayed(self, after: str) -> None:
        pass

    def ended(self, *args: Any, **kwargs: Any) -> None:
        pass


OFF = Off()


_current: ContextVar[RequestTrace | Off] = ContextVar("request_trace", default=OFF)


def trace_of(scope: Scope) -> RequestTrace | Off:
    return scope.get(SCOPE_KEY, OFF)


def current() -> RequestTrace | Off:
    """The trace of the request this task serves (OFF outside one, or tracing off)."""
    return _current.get()


class TraceMiddleware:
    """Gives each HTTP request a `RequestTrace`. Once the response is sent, it ends the span
    with the response's status."""

    def __init__(self, app: ASGIApp, tracer: Any) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        trace = scope[SCOPE_KEY] = RequestTrace(self.tracer, scope["method"], headers)
        token = _current.set(trace)
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _current.reset(token)
            if trace.span is not None:
                trace.span.set_attribute("http.response.status_code", status)
                if status >= 500 and trace.span.status.is_unset:
                    from opentelemetry.trace import StatusCode

                    trace.span.set_status(StatusCode.ERROR)
                trace.span.end()


# the process's, once `middleware` made it (tracing on)
_tracer: Any = None


def middleware() -> list[tuple[type, dict]]:
    """The middleware tracing needs (none when it is off), as (class, options)."""
    global _tracer
    _tracer = _tracer or otel.tracer(propagation.API_SERVICE, "tokenspool.api")
    return [] if _tracer is None else [(TraceMiddleware, {"tracer": _tracer})]


def attempt_lost(trace_context: str, job_id: str, epoch: int, worker: str, why: str) -> None:
    """Close the span of an attempt whose worker died, since the worker cannot. The reaper
    found it dead. Its span id is the one the worker gave it
    (contract/tracing/propagation.py `attempt_span_id`). So the children the worker exported
    before it died hang under it."""
    parsed = propagation.parse(propagation.uncarry(trace_context)[0]) if trace_context else None
    if _tracer is None or parsed is None:
        return
    from opentelemetry.trace import SpanKind, StatusCode

    span = otel.start_span(
        _tracer,
        propagation.attempt_span_id(parsed[0], job_id, epoch),
        f"attempt {epoch}",
        context=otel.context_of(trace_context),
        kind=SpanKind.CONSUMER,
        attributes={
            "tokenspool.job_id": job_id,
            "tokenspool.attempt": epoch,
            "tokenspool.worker": worker,
            "tokenspool.lost": why,
            "tokenspool.recorded_by": "reaper",
        },
    )
    span.set_status(StatusCode.ERROR, f"worker lost: {why}")
    span.end()


def tracing_on() -> bool:
    """Whether this process traces (its app was made with tracing on)."""
    return _tracer is not None
