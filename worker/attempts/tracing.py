"""The worker's traces (contract/tracing/). Each attempt has one span, `attempt <epoch>`. It
sits in the trace of the request that made the job (its spec's `trace_context`). Its children
are its claim, its prefill (prompt tokens read, cached tokens), its decode (tokens, steps) and
its publish. Its events show where its first token's time goes. They are its prompt
tokenized, its first token sampled, and that token written to the stream (bench/hops.py reads
them). A continuation's span links to the attempt it goes on from. Every process can derive
that span's id (`propagation.attempt_span_id`). The span also says
`tokenspool.resumed_from_token`.

Nothing here runs per token. The first token is one event (`observed`). `observed` also adds
each pick's work to the profile's counters. Totals are attributes set at the end. With tracing
off (`start` found it off), `begin` gives every attempt `OFF`. Its methods do nothing and
import nothing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from contract.jobspec import JobSpec
from contract.stats import BatchCounters
from contract.tracing import otel, propagation
from worker.engine.steps.picks import Pick

# outcomes that are no error
FINE = ("stop", "length", "tool_calls", "cancelled", "handed-off")
# the process's, once `start` made it (tracing on)
_tracer: Any = None


def start() -> bool:
    """Set up the worker's tracer from OpenTelemetry's environment, and say whether tracing is
    on. The `JobRunner` calls it once."""
    global _tracer
    _tracer = _tracer or otel.tracer(propagation.WORKER_SERVICE, "tokenspool.worker")
    return _tracer is not None


class AttemptTrace:
    """One attempt's span and its children, opened at the claim, ended by `ended`."""

    on = True

    def __init__(self, spec: JobSpec, epoch: int, worker: str, claim_ns: tuple[int, int]) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        parsed = propagation.parse(propagation.uncarry(spec.trace_context)[0]) if spec.trace_context else None
        self._job_id, self._trace_id = spec.id, parsed[0] if parsed is not None else 0
        self.span = otel.start_span(
            _tracer,
            propagation.attempt_span_id(parsed[0], spec.id, epoch) if parsed is not None else 0,
            f"attempt {epoch}",
            context=otel.context_of(spec.trace_context) if parsed is not None else None,
            kind=SpanKind.CONSUMER,
            start_time=claim_ns[0],
            attributes={
                "tokenspool.job_id": spec.id,
                "tokenspool.attempt": epoch,
                "tokenspool.worker": worker,
                "tokenspool.tier": spec.priority,
                # until it reads what an earlier attempt wrote
                "tokenspool.resumed": False,
                "gen_ai.request.model": spec.model,
            },
        )
        self._context = set_span_in_context(self.span)
        self._child("claim", *claim_ns)
        # when it began reading its prompt
        self._read_at = claim_ns[1]
        # its first token (0: none yet)
        self._first_at = 0
        # the tokens its prefill reads
        self._read = 0
        # of those, the ones its slot's cache held
        self._cached = 0
        # its end's write (0: not written)
        self._publish_at = self._published_at = 0
        # its first token is in the stream
        self._first_out = False

    def _child(self, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        named = {f"tokenspool.{k}": v for k, v in attributes.items()}
        span = _tracer.start_span(name, context=self._context, start_time=start_ns, attributes=named)
        span.end(end_time=end_ns)

    def reading(self, prompt: int, prior: int, earlier: int) -> None:
        """The attempt reads its prompt and what earlier attempts generated (`prior`). The
        last of them, if any, had epoch `earlier` (dead, handed off or preempted). The span
        links to it."""
        self._read_at, self._read = time.time_ns(), prompt + prior
        if earlier:
            self.span.set_attribute("tokenspool.resumed", True)
            self.span.set_attribute("tokenspool.resumed_from_token", prior)
            if self._trace_id:
                span_id = propagation.attempt_span_id(self._trace_id, self._job_id, earlier)
                self.span.add_link(
                    otel.link_to(self._trace_id, span_id).context, {"tokenspool.link": "resumed"}
                )

    def prompted(self) -> None:
        """Its prompt is rendered and tokenized."""
        self.span.add_event("prompt tokenized")

    def first_token(self) -> None:
        """Its first token: the prefill is over (one event, never one per token)."""
        self._first_at = time.time_ns()
        self.span.add_event("first token", timestamp=self._first_at)

    def first_written(self) -> None:
        """The publisher has written its first token to the stream (the writer's thread; once)."""
        if not self._first_out:
            self._first_out = True
            self.span.add_event("first token written")

    def publishing(self, cached: int) -> None:
        """It writes its end (`cached`: the prompt tokens its slot's cache held)."""
        self._publish_at, self._cached = time.time_ns(), cached

    def published(self) -> None:
        self._published_at = time.time_ns()

    def ended(self, outcome: str, tokens: int, steps: int) -> None:
        """The attempt's end: its prefill, decode and publish as children, its totals."""
        end = time.time_ns()
        first, publish, published = self._first_at or end, self._publish_at or end, self._published_at
        self._child("prefill", self._read_at, first, tokens=self._read, cached_tokens=self._cached)
        if self._first_at:
            self._child("decode", first, publish, tokens=tokens, steps=steps)
        if published:
            self._child("publish", publish, published)
        span = self.span
        span.set_attribute("tokenspool.outcome", outcome)
        span.set_attribute("gen_ai.usage.input_tokens", self._read)
        span.set_attribute("gen_ai.usage.output_tokens", tokens)
        if outcome not in FINE:
            from opentelemetry.trace import StatusCode

            span.set_status(StatusCode.ERROR, outcome)
        span.end(end_time=end)


class Off:
    """Tracing off: every call does nothing."""

    on = False

    def reading(self, prompt: int, prior: int, earlier: int) -> None:
        pass

    def prompted(self) -> None:
        pass

    def first_token(self) -> None:
        pass

    def first_written(self) -> None:
        pass

    def publishing(self, cached: int) -> None:
        pass

    def published(self) -> None:
        pass

    def ended(self, outcome: str, tokens: int, steps: int) -> None:
        pass


OFF = Off()


def observed(
    picks: Iterator[tuple[Pick, bytes]], counters: BatchCounters, first: Callable[[], None]
) -> Iterator[tuple[Pick, bytes]]:
    """An attempt's picks as its observers see them. Each one's work on this thread goes to
    the profile's counters. The work counts from its arrival to the ask for the next. A lost
    increment between threads is a rounding error there. The first pick is told to `first`
    (its trace's `first_token`), once, before the loop. Nothing runs per token."""
    head = next(picks, None)
    if head is None:
        return
    first()
    for item in itertools.chain((head,), picks):
        got = time.perf_counter()
        yield item
        counters.token_us += int((time.perf_counter() - got) * 1e6)
        counters.tokens += 1


def begin(spec: JobSpec, epoch: int, worker: str, claim_ns: tuple[int, int]) -> AttemptTrace | Off:
    """The span of a claimed attempt (`claim_ns`: when its claim began and ended)."""
    return OFF if _tracer is None else AttemptTrace(spec, epoch, worker, claim_ns)
