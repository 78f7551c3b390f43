"""Traces across the API, the queue, two workers, a worker's death and a resume on another API
replica, exported over real OTLP/HTTP (protobuf) to a receiver in this process and decoded
with opentelemetry-proto (docs/operations.md, "Tracing")."""

from __future__ import annotations

import http.server
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from contract import keys
from contract.tracing import propagation
from devstack.processes import free_port, start_api, start_redis
from devstack.sse_contract import check_stream, read_opening
from tests.hold import HOLD_TOKENS, NO_END
from tests.integration.conftest import MODEL
from tests.integration.test_recovery import API_ENV, Pool, _read_until

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper, a storm and a ship."}]


@dataclass
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent: str
    attributes: dict
    links: list[tuple[str, str, dict]]
    events: list[tuple[str, dict]]
    status: int


def _value(v) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    """An OTLP/HTTP trace receiver on loopback: POST /v1/traces, protobuf."""

    port: int = field(default_factory=free_port)
    spans: list[Span] = field(default_factory=list)
    posts: int = 0

    def start(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                if ok:
                    receiver.take(body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.posts += 1
        for rs in request.resource_spans:
            service = _attrs(rs.resource.attributes)["service.name"]
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(
                        Span(
                            service,
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            _attrs(s.attributes),
                            [(k.trace_id.hex(), k.span_id.hex(), _attrs(k.attributes)) for k in s.links],
                            [(e.name, _attrs(e.attributes)) for e in s.events],
                            s.status.code,
                        )
                    )

    def env(self) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans arrive soon after they end
        }

    def wait(self, until, timeout: float = 60) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until(list(self.spans)):
                return list(self.spans)
            time.sleep(0.2)
        raise AssertionError(f"the spans never came: {[(s.service, s.name) for s in self.spans]}")


@dataclass
class TracedPool(Pool):
    """A pool whose every worker, those `ensure` starts again included, exports spans."""

    otel: dict[str, str] = field(default_factory=dict)

    def spawn(self, env: dict[str, str] | None = None):
        return super().spawn({**self.otel, **(env or {})})


@dataclass
class Traced:
    pool: Pool
    receiver: Receiver
    other: str  # a second API replica's base URL
    untraced: str  # a third replica with tracing off, its endpoint another receiver's
    quiet: Receiver


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Iterator[Traced]:
    logs = tmp_path_factory.mktemp("tracing")
    receiver, quiet = Receiver(), Receiver()
    receiver.start()
    quiet.start()
    redis_proc, url = start_redis(logs)
    env = {**API_ENV, **receiver.env()}
    api, base = start_api(logs, url, env=env)
    other, other_base = start_api(logs, url, name="api2", env=env)
    off_env = {**API_ENV, **quiet.env(), "OTEL_TRACES_EXPORTER": "none", "LOG_LEVEL": "debug"}
    untraced, untraced_base = start_api(logs, url, name="api3", env=off_env)
    pool = TracedPool(logs, url, base, redis.Redis.from_url(url), redis_proc, api, otel=receiver.env())
    try:
        pool.ensure(2)
        yield Traced(pool, receiver, other_base, untraced_base, quiet)
    finally:
        for w in pool.workers.values():
            w.signal(signal.SIGKILL)
        for p in (api, other, untraced, redis_proc):
            p.stop()
        receiver.stop()
        quiet.stop()


def _post(base: str, body: dict, headers: dict | None = None):
    return httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=120)


def test_a_request_whose_worker_dies_is_one_trace(traced):
    pool, receiver = traced.pool, traced.receiver
    pool.ensure(2)
    parent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
    body = {
        "model": MODEL,
        "messages": LONG,
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": NO_END,
    }
    # another request at the same time, in a trace of its own
    bystander = {"model": MODEL, "messages": LONG, "max_tokens": 4}
    with _post(pool.base, body, {"traceparent": parent, "tracestate": "vendor=1"}) as resp:
        lines = resp.iter_lines()
        got, opening = read_opening(lines)
        job_id = opening["id"]
        holder = pool.holder(job_id)
        dead = pool.r.hget(keys.job(job_id), keys.JobField.WORKER).decode()
        other = httpx.post(pool.base + "/v1/chat/completions", json=bystander, timeout=120)
        assert other.status_code == 200, other.text
        got += _read_until(lines, lambda n: n >= 4)
        holder.signal(signal.SIGKILL)
        got += list(lines)
    parsed = check_stream("".join(line + "\n" for line in got).encode(), "chat", include_usage=True)
    assert parsed.error is None and parsed.chunks[-1]["usage"]["completion_tokens"] == 48

    def complete(spans: list[Span]) -> bool:
        ours = [s for s in spans if s.trace_id == TRACE_ID]
        names = {(s.service, s.name) for s in ours}
        attempts = {s.service for s in ours if s.name.startswith("attempt ")}
        return ("tokenspool-api", f"chat {MODEL}") in names and attempts == {
            "tokenspool-api",
            "tokenspool-worker",
        }

    spans = [s for s in receiver.wait(complete) if s.trace_id == TRACE_ID]
    (server,) = [s for s in spans if s.service == "tokenspool-api" and s.name == f"chat {MODEL}"]
    assert server.parent == CLIENT_SPAN  # in the client's trace
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.response.id"] == job_id
    assert a["gen_ai.usage.output_tokens"] == 48 and a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["tokenspool.tier"] == "default" and a["tokenspool.ttft_ms"] > 0
    assert a["tokenspool.queue_wait_ms"] >= 0
    assert a["tokenspool.routed"] in (True, False)  # PREFIX_ROUTING weighed it
    # where its first token's time went (bench/hops.py): once each, never per token
    assert [e[0] for e in server.events] == ["enqueued", "relay", "first token sent"]

    # the first closed by the reaper that found its worker dead, the second by its worker
    (first,) = [s for s in spans if s.name.startswith("attempt ") and s.service == "tokenspool-api"]
    (second,) = [s for s in spans if s.name.startswith("attempt ") and s.service == "tokenspool-worker"]
    assert first.name == f"attempt {first.attributes['tokenspool.attempt']}"
    assert second.attributes["tokenspool.attempt"] > first.attributes["tokenspool.attempt"]
    assert first.parent == second.parent == server.span_id  # both in the request's trace
    assert first.status == 2 and first.attributes["tokenspool.recorded_by"] == "reaper"  # ERROR: lost
    assert first.attributes["tokenspool.worker"] == dead
    epoch = first.attributes["tokenspool.attempt"]
    assert first.span_id == f"{propagation.attempt_span_id(int(TRACE_ID, 16), job_id, epoch):016x}"
    s = second.attributes
    assert s["tokenspool.resumed"] is True and 4 <= s["tokenspool.resumed_from_token"] < 48
    assert [(t, i) for t, i, _ in second.links] == [(TRACE_ID, first.span_id)]  # goes on from it
    assert s["tokenspool.worker"] != dead
    assert s["gen_ai.usage.output_tokens"] == 48 - s["tokenspool.resumed_from_token"]
    assert s["tokenspool.outcome"] == "length"

    children = {x.name: x for x in spans if x.parent == second.span_id}
    assert {"claim", "prefill", "decode", "publish"} <= set(children)
    assert children["decode"].attributes["tokenspool.tokens"] == s["gen_ai.usage.output_tokens"]
    assert children["prefill"].attributes["tokenspool.tokens"] >= s["tokenspool.resumed_from_token"]
    events = [e for x in spans for e in x.events]
    assert [e[0] for e in events if e[0] == "first token"] == ["first token"]  # one, never per token
    assert [e[0] for e in events if e[0] == "first token written"] == ["first token written"]
    # nothing of the other request in this trace (its spans are in one of their own)
    assert all(x.attributes.get("tokenspool.job_id", job_id) == job_id for x in spans)
    assert all(x.attributes.get("gen_ai.response.id", job_id) == job_id for x in spans)
    theirs = [x for x in receiver.spans if x.attributes.get("gen_ai.response.id") == other.json()["id"]]
    assert theirs and all(x.trace_id != TRACE_ID for x in theirs)


def test_a_hand_off_at_shutdown_is_two_attempts_of_one_trace(traced):
    pool, receiver = traced.pool, traced.receiver
    pool.ensure(2)
    trace_id = "5c5a1c8f0c5e4b6e9a7d3f2e1b0a9c8d"
    body = {"model": MODEL, "messages": LONG, "max_tokens": HOLD_TOKENS, "stream": True, "logit_bias": NO_END}
    with _post(pool.base, body, {"traceparent": f"00-{trace_id}-a1b2c3d4e5f60718-01"}) as resp:
        lines = resp.iter_lines()
        _, opening = read_opening(lines)
        job_id = opening["id"]
        holder = pool.holder(job_id)
        first_worker = pool.r.hget(keys.job(job_id), keys.JobField.WORKER)
        holder.signal(signal.SIGTERM)  # it hands the job off after its grace (1 s)
        deadline = time.monotonic() + 60
        job = keys.job(job_id)
        while (
            pool.r.hget(job, keys.JobField.WORKER) in (first_worker, b"", None)
            or pool.r.hget(job, keys.JobField.STATUS) != b"running"
        ):  # until another worker runs it
            assert time.monotonic() < deadline, "the job was never handed off"
            time.sleep(0.05)
        _read_until(lines, lambda n: n >= 2)
        httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel", timeout=30)
        list(lines)

    def both(spans: list[Span]) -> bool:
        return len([s for s in spans if s.trace_id == trace_id and s.name.startswith("attempt ")]) == 2

    first, second = sorted(
        (s for s in receiver.wait(both) if s.trace_id == trace_id and s.name.startswith("attempt ")),
        key=lambda s: s.attributes["tokenspool.attempt"],
    )
    assert {first.service, second.service} == {"tokenspool-worker"}  # each ended by its own worker
    assert first.attributes["tokenspool.outcome"] == "handed-off" and first.status != 2
    assert second.attributes["tokenspool.outcome"] == "cancelled"
    assert second.attributes["tokenspool.resumed"] is True
    assert (
        second.attributes["tokenspool.resumed_from_token"] == first.attributes["gen_ai.usage.output_tokens"]
    )
    assert [(t, i) for t, i, _ in second.links] == [(trace_id, first.span_id)]


def _resumed(span: Span) -> bool:
    return span.attributes.get("tokenspool.follows") and span.attributes["http.request.method"] == "GET"


def test_a_resume_on_another_replica_joins_the_request_trace(traced):
    pool, receiver = traced.pool, traced.receiver
    pool.ensure(2)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    body = {"model": MODEL, "messages": LONG, "max_tokens": HOLD_TOKENS, "stream": True, "logit_bias": NO_END}
    body["background"] = True  # runs on once its first client has gone
    with _post(pool.base, body, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}) as resp:
        lines = resp.iter_lines()
        _, opening = read_opening(lines)
        job_id = opening["id"]
        _read_until(lines, lambda n: n >= 2)
    resumer = "00-11111111111111111111111111111111-2222222222222222-01"  # the resuming client's own
    url = f"{traced.other}/v1/chat/completions/{job_id}?stream=true"
    with httpx.stream("GET", url, headers={"traceparent": resumer}, timeout=120) as resp:
        assert resp.status_code == 200
        _read_until(resp.iter_lines(), lambda n: n >= 2)
    httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel", timeout=30)

    def resumed(spans: list[Span]) -> bool:
        return any(_resumed(s) for s in spans if s.trace_id == trace_id)

    spans = [s for s in receiver.wait(resumed) if s.trace_id == trace_id and s.service == "tokenspool-api"]
    (made,) = [s for s in spans if not s.attributes["tokenspool.follows"]]
    (again,) = [s for s in spans if _resumed(s)]
    assert again.parent == made.span_id and again.attributes["gen_ai.response.id"] == job_id
    assert [(t, i) for t, i, _ in again.links] == [("1" * 32, "2" * 16)]  # its own client's trace
    (relay,) = [e for e in again.events if e[0] == "relay"]
    (first_relay,) = [e for e in made.events if e[0] == "relay"]
    assert relay[1]["tokenspool.replica"] != first_relay[1]["tokenspool.replica"]  # another replica
    receiver.wait(
        lambda spans: any(
            s.trace_id == trace_id
            and s.attributes.get("http.request.method") == "POST"
            and s.attributes.get("tokenspool.follows")
            for s in spans
        )
    )  # the cancel too


def test_tracing_off_sends_nothing(traced):
    quiet = traced.quiet
    body = {"model": MODEL, "messages": LONG, "max_tokens": 4}
    resp = httpx.post(
        traced.untraced + "/v1/chat/completions",
        json=body,
        headers={"traceparent": f"00-{'3' * 32}-{'4' * 16}-01"},
    )
    assert resp.status_code == 200, resp.text
    time.sleep(1.0)  # five of its batch delays
    assert quiet.posts == 0
    # the workers trace: the job's attempt is a trace of its own, not the client's
    assert all(s.trace_id != "3" * 32 for s in traced.receiver.spans)
