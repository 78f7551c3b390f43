"""This API process's own metrics (one registry per app, no global).

They are open streams, and time to first token and inter-token latency per stream
(`StreamTiming`). They are also jobs created, resumed streams and refusals. A known key's
refusals are counted by its key id too. `GET /metrics` (api/ops/prometheus.py) serves them
beside the cluster's."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """This process's own metrics. One instance per app (no global registry)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.streams_open = Gauge(
            "tokenspool_streams_open", "SSE streams this API process is relaying now.", registry=r
        )
        latency = dict(labelnames=["model"], registry=r)
        self.ttft = Histogram(
            "tokenspool_time_to_first_token_seconds",
            "From the request's arrival to its first content chunk sent (new streams only).",
            buckets=_TTFT_BUCKETS,
            **latency,
        )
        self.itl = Histogram(
            "tokenspool_inter_token_latency_seconds",
            "Time between consecutive content chunks sent on a stream.",
            buckets=_ITL_BUCKETS,
            **latency,
        )
        self.created = Counter(
            "tokenspool_jobs_created",
            "Jobs created, by API endpoint (chat, text, responses).",
            ["surface"],
            registry=r,
        )
        self.resumed = Counter(
            "tokenspool_streams_resumed", "Streams reopened with GET ...?stream=true.", registry=r
        )
        self.rejected = Counter(
            "tokenspool_requests_rejected",
            "Requests refused with an error status, by error code.",
            ["reason"],
            registry=r,
        )
        self.key_rejected = Counter(
            "tokenspool_key_requests_rejected",
            "Requests of a known key refused, by its key id (METRICS_KEYS; the rest `other`) and error code.",
            ["key", "reason"],
            registry=r,
        )


class StreamTiming:
    """Time to first token and inter-token latency of one stream, as its client receives
    content. A resumed stream (no arrival time) counts no time to first token."""

    def __init__(self, metrics: Metrics, model: str, arrived: float | None) -> None:
        self._ttft = metrics.ttft.labels(model)
        self._itl = metrics.itl.labels(model)
        # monotonic
        self._last = arrived
        self._seen = False
        # the stream of the request that made the job
        self.fresh = arrived is not None
        # its time to first token, once sent (0: none yet, or a resume)
        self.ttft_s = 0.0

    def sent(self, contents: int) -> None:
        for _ in range(contents):
            now = time.monotonic()
            if self._last is not None:
                if self._seen:
                    self._itl.observe(now - self._last)
                else:
                    self.ttft_s = now - self._last
                    self._ttft.observe(self.ttft_s)
            self._last, self._seen = now, True
