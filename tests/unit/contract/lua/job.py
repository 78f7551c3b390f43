"""One recorded job on fakeredis, as the job and attempt scripts' tests share it: its id, the
recovery settings, its stream read back, and an ABANDON of it. conftest.py's `r` holds it."""

from __future__ import annotations

import dataclasses

import fakeredis

from contract import entries, keys
from contract.lua import jobs, library
from contract.settings import Recovery
from tests.unit.recorded import record_queued

RECOVERY = Recovery(retention_s=60)

CID = "chatcmpl-test"


def queued() -> fakeredis.FakeRedis:
    """A server holding the job, queued, its hash expiring as the API records it."""
    client = fakeredis.FakeRedis()
    record_queued(client, CID)
    client.expire(keys.job(CID), 1000)
    return client


def stream(r) -> list:
    return [entries.decode(f) for _, f in r.xrange(keys.events(CID))]


def abandon(r, epoch, max_attempts=3, charge=True, suspect_after=0, max_requeues=20, counted=True, group=0):
    """ABANDON the job's attempt at `epoch`, as the reaper or a worker's hand-off does: its outcome."""
    script = r.register_script(jobs.ABANDON)
    recovery = dataclasses.replace(RECOVERY, max_attempts=max_attempts, max_requeues=max_requeues)
    args = jobs.abandon_args(
        CID,
        epoch,
        charge=charge,
        suspect_after=suspect_after,
        recovery=recovery,
        counted=counted,
        group=group,
    )
    outcome, _, _, _ = script(keys=library.job_keys(CID), args=args)
    return outcome
