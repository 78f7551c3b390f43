"""The API's tracing: off, it imports nothing of OpenTelemetry (beyond what redis-py itself
imports) and adds no middleware; on, its spans are the API's service (a fresh interpreter
each: the tracer provider is global)."""

import json
import os
import subprocess
import sys

MAKE_APP = """
import json, sys
import redis  # redis-py 8 imports OpenTelemetry's metrics itself, where installed
before = {m for m in sys.modules if m.startswith('opentelemetry')}
from api.app import create_app
from api.http import tracing
from api.settings import Access, Settings
app = create_app(Settings(access=Access(api_keys=("sesame",))))
out = {
    "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry") and m not in before),
    "middleware": [m.cls.__name__ for m in app.user_middleware],
    "on": tracing.tracing_on(),
}
if out["on"]:
    from opentelemetry import trace
    out["service"] = trace.get_tracer_provider().resource.attributes["service.name"]
print(json.dumps(out))
"""


def _app(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", MAKE_APP], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_tracing_off_imports_nothing_of_opentelemetry():
    app = _app()
    assert app == {"otel": [], "middleware": ["APIKeyMiddleware"], "on": False}


def test_tracing_on_traces_every_request_as_the_api():
    app = _app(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert app["on"] and app["middleware"][0] == "TraceMiddleware" and app["service"] == "tokenspool-api"
    named = _app(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SERVICE_NAME="edge-api")
    assert named["service"] == "edge-api"
