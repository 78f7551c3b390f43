"""api/jobs/state.py: a job's state read back from its hash's fields, and a new job's hash as the
API records it (written to fakeredis and read back as the job store reads it)."""

from __future__ import annotations

import fakeredis
import pytest

from api.jobs.state import STATE_FIELDS, JobState, job_state, record_fields
from contract import keys
from contract.jobspec import JobSpec, Message, digest
from contract.keys import JobField, JobStatus

SPEC = JobSpec(id="chatcmpl-1", kind="chat", model="m", messages=(Message("user", "hi"),), priority="flex")


def new_state(**changes) -> JobState:
    fields = dict(id="chatcmpl-1", endpoint="chat", model="m", created=1_700_000_000, owner="alice")
    return JobState(**{**fields, "status": JobStatus.QUEUED, **changes})


def row(**fields: bytes | None) -> list:
    """A job hash's STATE_FIELDS as HMGET returns them (None for a field it lacks)."""
    return [fields.get(name) for name in STATE_FIELDS]


def test_a_job_without_a_status_is_no_job():
    assert job_state("chatcmpl-1", row()) is None
    assert job_state("chatcmpl-1", row(**{JobField.MODEL: b"m", JobField.OWNER: b"alice"})) is None


def test_every_field_of_the_hash_is_read_into_the_state():
    values = row(
        **{
            JobField.SURFACE: b"responses",
            JobField.MODEL: b"m",
            JobField.CREATED: b"1700000000",
            JobField.OWNER: b"alice",
            JobField.STATUS: b"running",
            JobField.ATTEMPTS: b"3",
            JobField.START_BY: b"1700000005000",
            JobField.USAGE: b"1",
            JobField.DETACHED: b"1",
            JobField.ECHO: b'{"store":true}',
            JobField.REASONING: b"reasoning",
            JobField.KEPT_AT: b"1700000009000",
        }
    )
    assert job_state("resp_1", values) == JobState(
        id="resp_1",
        endpoint="responses",
        model="m",
        created=1_700_000_000,
        owner="alice",
        status="running",
        attempts=3,
        start_by_ms=1_700_000_005_000,
        include_usage=True,
        detached=True,
        echo='{"store":true}',
        reasoning_field="reasoning",
        kept_at=1_700_000_009_000,
    )


def test_fields_a_hash_lacks_read_as_their_defaults():
    state = job_state("chatcmpl-1", row(**{JobField.STATUS: b"queued"}))
    assert state == JobState(
        id="chatcmpl-1", endpoint="", model="", created=0, owner="", status="queued", attempts=0
    )
    assert state.start_by_ms is None and state.reasoning_field == "reasoning_content"


def test_only_a_one_turns_usage_and_detached_on_and_an_empty_start_by_is_none():
    values = row(
        **{JobField.STATUS: b"queued", JobField.USAGE: b"0", JobField.DETACHED: b"", JobField.START_BY: b""}
    )
    state = job_state("chatcmpl-1", values)
    assert (state.include_usage, state.detached, state.start_by_ms) == (False, False, None)


@pytest.mark.parametrize(
    ("status", "ended"),
    [("queued", False), ("running", False), ("done", True), ("failed", True), ("cancelled", True)],
)
def test_a_job_has_ended_once_done_failed_or_cancelled(status, ended):
    assert new_state(status=status).ended is ended


def test_a_new_job_s_hash_is_queued_at_epoch_zero_with_its_spec_and_digest():
    fields = record_fields(SPEC, '{"spec":1}', new_state(include_usage=True), None, None)
    assert fields == {
        JobField.MODEL: "m",
        JobField.SURFACE: "chat",
        JobField.CREATED: 1_700_000_000,
        JobField.STATUS: JobStatus.QUEUED,
        JobField.EPOCH: 0,
        JobField.ATTEMPTS: 0,
        JobField.SPEC: '{"spec":1}',
        JobField.DIGEST: digest(SPEC.to_dict()),
        JobField.OWNER: "alice",
        JobField.USAGE: 1,
        JobField.DETACHED: 0,
        JobField.PRIORITY: "flex",
    }


def test_start_by_idempotency_and_deadline_are_written_only_when_given():
    bare = record_fields(SPEC, "{}", new_state(), "", None)
    assert not {JobField.START_BY, JobField.IDEMPOTENCY, JobField.DEADLINE} & bare.keys()
    full = record_fields(SPEC, "{}", new_state(start_by_ms=5), "ts:idem:x", 0)
    assert (full[JobField.START_BY], full[JobField.IDEMPOTENCY], full[JobField.DEADLINE]) == (
        5,
        "ts:idem:x",
        0,
    )


def test_a_recorded_hash_reads_back_as_the_state_it_was_made_from():
    r = fakeredis.FakeRedis()
    state = new_state(start_by_ms=1_700_000_030_000, include_usage=True, detached=True)
    r.hset(keys.job(state.id), mapping=record_fields(SPEC, "{}", state, "ts:idem:x", 1_700_000_600_000))
    assert job_state(state.id, r.hmget(keys.job(state.id), STATE_FIELDS)) == state
