import sys

import pytest

from contract.settings import SettingError
from contract.tracing import otel


def test_tracing_off_makes_no_tracer(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert otel.tracer("tokenspool-api", "t") is None


def test_tracing_asked_for_without_opentelemetry_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)  # as if the extra were missing
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(SettingError, match=r"tokenspool\[tracing\]"):
        otel.tracer("tokenspool-api", "t")
