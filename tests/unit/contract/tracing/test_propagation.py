import pytest

from contract.jobspec import InvalidSpec, JobSpec, Message
from contract.tracing import propagation

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _spec(**kw) -> JobSpec:
    return JobSpec(id="chatcmpl-x", kind="chat", model="m", messages=(Message("user", "hi"),), **kw)


def test_a_traceparent_is_read_and_a_bad_one_refused():
    assert propagation.parse(PARENT) == (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    for bad in ("", "garbage", PARENT.upper(), "01" + PARENT[2:], f"00-{'0' * 32}-00f067aa0ba902b7-01"):
        assert propagation.parse(bad) is None, bad
    assert propagation.parse(f"00-{'a' * 32}-{'0' * 16}-01") is None  # a zero span id


def test_a_trace_context_travels_with_its_tracestate():
    carried = propagation.carry(PARENT, "vendor=1,other=2")
    assert propagation.uncarry(carried) == (PARENT, "vendor=1,other=2")
    assert propagation.carry(PARENT) == PARENT and propagation.uncarry(PARENT) == (PARENT, "")
    assert propagation.carry(PARENT, "x" * 513) == PARENT  # too long a tracestate is dropped
    assert propagation.valid("") and propagation.valid(carried)
    assert not propagation.valid("nonsense") and not propagation.valid(PARENT + "\na\nb")


def test_a_job_carries_its_trace_only_when_traced():
    assert "trace_context" not in _spec().to_dict()  # a worker of an earlier release takes the job
    spec = _spec(trace_context=propagation.carry(PARENT, "vendor=1"))
    assert JobSpec.from_dict(spec.to_dict()) == spec
    for bad in ("not a traceparent", 7):
        with pytest.raises(InvalidSpec):
            JobSpec.from_dict({**_spec().to_dict(), "trace_context": bad})


def test_every_process_gives_an_attempt_the_same_span_id():
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    one = propagation.attempt_span_id(trace_id, "chatcmpl-x", 1)
    assert one == propagation.attempt_span_id(trace_id, "chatcmpl-x", 1)
    assert 0 < one < 2**64
    others = {
        propagation.attempt_span_id(trace_id, "chatcmpl-x", 2),
        propagation.attempt_span_id(1, "chatcmpl-x", 1),
    }
    assert one not in others


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_opentelemetrys_environment_turns_tracing_on(env, on):
    assert propagation.enabled(env) is on
