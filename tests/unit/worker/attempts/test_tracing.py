"""The worker's tracing: off, it imports nothing of OpenTelemetry (beyond what redis-py
itself imports) and every attempt's trace does nothing; on, its spans are the worker's
service (a fresh interpreter each: the tracer provider is global)."""

import json
import os
import subprocess
import sys

START = """
import json, sys
import redis  # redis-py 8 imports OpenTelemetry's metrics itself, where installed
before = {m for m in sys.modules if m.startswith('opentelemetry')}
import worker.__main__  # everything the worker's process imports
from contract.jobspec import JobSpec, Message
from worker.attempts import tracing
on = tracing.start()
spec = JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "hi"),))
trace = tracing.begin(spec, 1, "w1", (1, 2))
out = {"on": on, "off": trace is tracing.OFF}
if on:
    from opentelemetry import trace as api
    out["service"] = api.get_tracer_provider().resource.attributes["service.name"]
out["otel"] = sorted(m for m in sys.modules if m.startswith("opentelemetry") and m not in before)
print(json.dumps(out))
"""


def _worker(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", START], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_tracing_off_imports_nothing_of_opentelemetry():
    assert _worker() == {"on": False, "off": True, "otel": []}


def test_tracing_on_gives_attempts_spans_of_the_worker():
    worker = _worker(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert worker["on"] and not worker["off"] and worker["service"] == "tokenspool-worker"
    named = _worker(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SERVICE_NAME="gpu-pool")
    assert named["service"] == "gpu-pool"
