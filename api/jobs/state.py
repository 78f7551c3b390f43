"""What the API reads of a job. That is its state from the job's hash. It is also what the
reaper and the creating request learn of it. The job store (api/jobs/store.py) returns
these."""

from __future__ import annotations

from dataclasses import dataclass

from api.jobs.owners import MinuteUsage
from contract.entries import as_text
from contract.jobspec import JobSpec, digest
from contract.keys import JobField, JobStatus


@dataclass(frozen=True)
class JobState:
    """What the API knows of a job from its hash."""

    id: str
    endpoint: str
    model: str
    created: int
    owner: str
    status: str
    attempts: int = 0
    start_by_ms: int | None = None
    include_usage: bool = False
    detached: bool = False
    # JobField.ECHO (the Responses endpoint's)
    echo: str = ""
    # JobField.REASONING (the chat endpoint's)
    reasoning_field: str = "reasoning_content"
    # JobField.KEPT_AT: when a client last attached again (ms; 0: none has)
    kept_at: int = 0

    @property
    def ended(self) -> bool:
        return self.status in JobStatus.ENDED


@dataclass(frozen=True)
class RunningAttempt:
    """A running attempt as the reaper judges it."""

    job_id: str
    epoch: int
    worker: str
    # its heartbeat key is alive
    beating: bool
    # the job was in a batch whose worker died (contract.lua.jobs.ABANDON)
    suspect: bool


@dataclass(frozen=True)
class Sweep:
    """A sweep of every shard, read in one go. The reaper looks at it each tick."""

    running: list[RunningAttempt]
    # jobs pending past the grace period (their enqueuer may have died)
    pending: list[str]


@dataclass(frozen=True)
class Submission:
    job: JobState
    # False: an earlier request with the same Idempotency-Key made the job
    new: bool
    # a new job's owner's counts this minute, once it was counted
    spent: MinuteUsage | None = None


STATE_FIELDS = [
    JobField.SURFACE,
    JobField.MODEL,
    JobField.CREATED,
    JobField.OWNER,
    JobField.STATUS,
    JobField.ATTEMPTS,
    JobField.START_BY,
    JobField.USAGE,
    JobField.DETACHED,
    JobField.ECHO,
    JobField.REASONING,
    JobField.KEPT_AT,
]


def job_state(job_id: str, values: list) -> JobState | None:
    """The state from the job hash's STATE_FIELDS, in their order (None: no such job)."""
    endpoint, model, created, owner, status, attempts, start_by, usage, detached, echo, reasoning, kept = (
        values
    )
    if status is None:
        return None
    return JobState(
        id=job_id,
        endpoint=as_text(endpoint or b""),
        model=as_text(model or b""),
        created=int(created or 0),
        owner=as_text(owner or b""),
        status=as_text(status),
        attempts=int(attempts or 0),
        start_by_ms=int(start_by) if start_by else None,
        include_usage=usage == b"1",
        detached=detached == b"1",
        echo=as_text(echo or b""),
        reasoning_field=as_text(reasoning or b"reasoning_content"),
        kept_at=int(kept or 0),
    )


def record_fields(
    spec: JobSpec, spec_json: str, state: JobState, idempotency_key: str | None, deadline_ms: int | None
) -> dict[str, str | int]:
    """A new job's hash, as contract.lua.jobs.RECORD writes it (its endpoint adds its own)."""
    fields: dict[str, str | int] = {
        JobField.MODEL: spec.model,
        JobField.SURFACE: state.endpoint,
        JobField.CREATED: state.created,
        JobField.STATUS: JobStatus.QUEUED,
        JobField.EPOCH: 0,
        JobField.ATTEMPTS: 0,
        JobField.SPEC: spec_json,
        JobField.DIGEST: digest(spec.to_dict()),
        JobField.OWNER: state.owner,
        JobField.USAGE: int(state.include_usage),
        JobField.DETACHED: int(state.detached),
        JobField.PRIORITY: spec.priority,
    }
    if state.start_by_ms is not None:
        fields[JobField.START_BY] = state.start_by_ms
    if idempotency_key:
        fields[JobField.IDEMPOTENCY] = idempotency_key
    if deadline_ms is not None:
        fields[JobField.DEADLINE] = deadline_ms
    return fields
