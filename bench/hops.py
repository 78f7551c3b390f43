"""Where a first token's time goes, read off the traces: one stream at a time through the
whole server (one worker, no size settings: bench/paired.py's `defaults`) with tracing on,
exporting over OTLP/HTTP to a receiver in this process, and the median of each hop from
the spans' own timestamps (every process runs on this machine: one clock).

    .venv/bin/python bench/hops.py [--runs 30] [--max-tokens 16] \\
        [--repeat "Tell me a short story about a fox."] [--out bench/results/RESULTS.md]

The hops, from the API's request span (`chat <model>`: it starts as the request arrives)
and the worker's attempt span (`attempt 1`: it starts as its claim does), with the events
docs/operations.md ("Tracing") lists:

- accept -> enqueued: the API reads, checks and admits the body, RECORD and the enqueue;
- enqueued -> claim: the worker wakes, TAKE, reads the spec (the queue wait);
- claim: CLAIM;
- claim -> prompt tokenized: the prompt rendered and tokenized;
- prompt tokenized -> prefill: the `Started` entry written;
- prefill: the prompt read (a repeated one: its last token), the first token sampled;
- first token -> written: the publisher's round trip (APPEND) of the first delta;
- written -> sent: the API's stream reader wakes, frames the chunk and sends it.

Plus the client's own TTFT (its clock: the same one) and what is left of it outside the
request span (the connection, the response's bytes back). The spans are what tracing
costs too (bench/paired.py's `traced<N>`), so each figure is a little above an untraced
one's. With `--repeat TEXT` every request sends that prompt (the prefix cache answers all of
it but its last token); without, each has a prompt of its own. Run by hand; never part of
the test suite.
"""

from __future__ import annotations

import argparse
import http.server
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.peer_servers import Tokenspool
from bench.lib.peers_report import machine, write_section
from devstack.processes import free_port

# (hop, its start, its end, what happens): marks are `<span>.start`, `<span>.end` or an event's name
HOPS = (
    ("accept -> enqueued", "request.start", "enqueued", "API: body read, checked, admitted; RECORD, enqueue"),
    ("enqueued -> claim", "enqueued", "claim.start", "worker: woken, TAKE, the spec read (queue wait)"),
    ("claim", "claim.start", "claim.end", "worker: CLAIM"),
    ("claim -> prompt tokenized", "claim.end", "prompt tokenized", "worker: prompt rendered, tokenized"),
    ("prompt tokenized -> prefill", "prompt tokenized", "prefill.start", "worker: `Started` written"),
    ("prefill", "prefill.start", "first token", "worker: prompt read, first token sampled"),
    ("first token -> written", "first token", "first token written", "worker: the first delta's APPEND"),
    ("written -> sent", "first token written", "first token sent", "API: stream reader wakes, SSE sent"),
)
_n = itertools.count()


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every span's start, end and events, by trace."""

    def __init__(self) -> None:
        self.port = free_port()
        self.marks: dict[str, dict[str, int]] = defaultdict(dict)  # trace id -> mark -> ns
        self.jobs: dict[str, str] = {}  # job id -> trace id
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.take(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self._span(s)

    def _span(self, s) -> None:
        marks = self.marks[s.trace_id.hex()]
        name = "request" if s.name.startswith("chat ") else s.name.split()[0]
        if name == "request":
            for kv in s.attributes:
                if kv.key == "gen_ai.response.id":
                    self.jobs[kv.value.string_value] = s.trace_id.hex()
        marks.setdefault(f"{name}.start", s.start_time_unix_nano)
        marks.setdefault(f"{name}.end", s.end_time_unix_nano)
        for e in s.events:
            marks.setdefault(e.name, e.time_unix_nano)

    def of(self, job_id: str) -> dict[str, int]:
        with self._lock:
            trace = self.jobs.get(job_id)
            return dict(self.marks[trace]) if trace else {}

    def env(self) -> dict[str, str]:
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans arrive soon after they end
        }


def one(client: httpx.Client, model: str, max_tokens: int, repeat: str) -> tuple[str, float, float]:
    """One streamed chat request: its job id, when it was sent and when its first content
    arrived (the client's clock, s)."""
    body = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": repeat or f"Note {next(_n)}: tell me about lighthouses."}],
    }
    sent, received, job_id = time.time(), 0.0, ""
    with client.stream("POST", "/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                job_id = chunk["id"]
                if not received and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    received = time.time()
    return job_id, sent, received


def hops_of(marks: dict[str, int], sent: float, received: float) -> dict[str, float] | None:
    """A request's hops in ms (None if a mark is missing)."""
    needed = {m for _, a, b, _ in HOPS for m in (a, b)}
    if not needed <= set(marks):
        return None
    out = {hop: (marks[b] - marks[a]) / 1e6 for hop, a, b, _ in HOPS}
    out["client TTFT"] = 1000 * (received - sent)
    out["request span to first token sent"] = (marks["first token sent"] - marks["request.start"]) / 1e6
    out["outside the span"] = out["client TTFT"] - out["request span to first token sent"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeat", default="", help="every request sends this prompt (cached)")
    ap.add_argument("--out", default="bench/results/RESULTS.md")
    args = ap.parse_args()
    receiver = Receiver()
    server = Tokenspool(Path(tempfile.mkdtemp(prefix="hops-")), 1, defaults=True, env=receiver.env())
    sent_at: list[tuple[str, float, float]] = []
    server.start()
    try:
        with httpx.Client(base_url=server.base + "/v1", timeout=60) as client:
            for _ in range(3):  # warm-up: the first requests page code and weights in
                one(client, server.model, 4, args.repeat)
            for i in range(args.runs):
                sent_at.append(one(client, server.model, args.max_tokens, args.repeat))
                time.sleep(0.2)  # the worker idle again, as for a lone stream
                print(f"run {i + 1}: TTFT {1000 * (sent_at[-1][2] - sent_at[-1][1]):.1f} ms", flush=True)
        rows: list[dict[str, float]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the last spans are exported in a batch's delay
            rows = [r for job, s, got in sent_at if (r := hops_of(receiver.of(job), s, got))]
            if len(rows) == len(sent_at):
                break
            time.sleep(0.5)
    finally:
        server.stop()
    if not rows:
        raise SystemExit("no request's trace had every hop")
    report(args, rows)


def report(args: argparse.Namespace, rows: list[dict[str, float]]) -> None:
    what = {hop: text for hop, _, _, text in HOPS}
    what |= {
        "request span to first token sent": "the API's span, from arrival to the first token's send",
        "outside the span": "client TTFT less the span's: connection, bytes to and from the client",
        "client TTFT": "time to first token, the client's clock",
    }
    prompt = f"the prompt {json.dumps(args.repeat)} every time" if args.repeat else "a prompt of its own each"
    lines = [
        "## Where a first token's time goes, from the traces (bench/hops.py)",
        "",
        f"Command: `.venv/bin/python bench/hops.py --runs {args.runs} --max-tokens {args.max_tokens}"
        f"{f' --repeat {json.dumps(args.repeat)}' if args.repeat else ''}`, "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        f"One stream at a time, {prompt}, through API, Redis and one worker (no size settings), "
        "tracing on to an OTLP/HTTP receiver in the benchmark; each hop from the spans' timestamps "
        f'(docs/operations.md, "Tracing"); medians and 90th percentiles of {len(rows)} requests, in ms.',
        "",
        "| hop | what happens | p50 ms | p90 ms |",
        "|---|---|---|---|",
    ]
    for hop in [h for h, _, _, _ in HOPS] + list(what)[len(HOPS) :]:
        values = sorted(r[hop] for r in rows)
        p90 = values[int(0.9 * (len(values) - 1))]
        lines.append(f"| {hop} | {what[hop]} | {statistics.median(values):.2f} | {p90:.2f} |")
    print("\n".join(lines))
    write_section(Path(args.out), "hops-repeat" if args.repeat else "hops", lines)


if __name__ == "__main__":
    main()
