"""contract/lifecycle/states.py and attempt.py: every name they give exists, every state is reached and left,
what derives from it agrees, and each move, run with its real Lua scripts on fakeredis,
moves the job or the attempt as the table says."""

from __future__ import annotations

import importlib
import json
import time
import uuid

import fakeredis
import pytest
import redis

from contract import errors, keys, queueing, tiers
from contract.entries import CANCELLED, Delta, Finished, Started
from contract.keys import JobField, JobStatus
from contract.lifecycle import attempt as life
from contract.lifecycle import states
from contract.lua import attempts, jobs, library, queues
from contract.servers import Servers
from contract.settings import Recovery
from devstack.lifecycle import key_pattern, queue_pattern

MODEL, WORKER = "m", "w1"
RECOVERY = Recovery(retention_s=60)
MOVES = states.JOB_MOVES + life.ATTEMPT_MOVES
TESTED: set[tuple[str, str]] = set()  # (table, move) of each test below that runs a move


def script(name: str) -> str:
    module, script_name = name.split(".")
    return getattr(importlib.import_module(f"contract.lua.{module}"), script_name)


@pytest.mark.parametrize("move", MOVES, ids=lambda m: m.name)
def test_every_script_function_and_key_a_move_names_exists(move):
    assert all("redis.call(" in script(s) for s in move.scripts)
    if move.via:
        module, function = move.via.split(".")
        assert callable(getattr(importlib.import_module(f"contract.{module}"), function))
    # put back: a transaction in api/jobs/store.py; preempt: in the worker's memory
    assert move.scripts or move.via or move.name in ("put back", "preempt")
    assert all(key_pattern(k).startswith(("ts:", "rq:")) for k in move.keys)


def test_every_script_of_a_job_s_stream_is_named_by_a_move():
    """A new script writing a job (contract/lua/attempts.py, jobs.py) needs its row in the table."""
    named = {s for m in MOVES for s in m.scripts}
    for module in ("attempts", "jobs"):
        found = vars(importlib.import_module(f"contract.lua.{module}"))
        scripts = {n for n, v in found.items() if n.isupper() and isinstance(v, str) and "redis." in v}
        lua = {f"{module}.{n}" for n in scripts - {"LIB"}}  # LIB: what they begin with
        assert lua and lua <= named, lua - named


def queues_of(state: states.State) -> set[str]:
    """The queues of MODEL that a waiting state's contract.tiers function names, for any tier."""
    name = getattr(tiers, state.queue)
    if state.queue == "attempt_queue_name":
        return {name(MODEL, p, continuation=True, suspect=False) for p in tiers.PRIORITIES}
    if state.queue == "suspect_queue_name":
        return {name(MODEL)}
    return {
        name(MODEL, p, *([WORKER] if "worker" in state.queue or "routed" in state.queue else []))
        for p in tiers.PRIORITIES
    }


def test_every_key_a_state_names_exists_and_its_queues_are_those_a_worker_takes_from():
    for state in states.JOB_STATES + life.ATTEMPT_STATES:
        assert all(key_pattern(k).startswith(("ts:", "rq:")) for k in state.keys), state.name
    waiting = [s for s in states.JOB_STATES if s.queue]
    assert all(queue_pattern(s.queue).startswith("rq:queue:") for s in waiting)
    taken = set(tiers.worker_queue_names(MODEL, WORKER))
    assert taken <= set().union(*map(queues_of, waiting))
    assert all(queues_of(s) & taken for s in waiting)


@pytest.mark.parametrize(
    ("table", "named"),
    [(states.JOB_MOVES, states.JOB_STATES), (life.ATTEMPT_MOVES, life.ATTEMPT_STATES)],
    ids=["job", "attempt"],
)
def test_every_state_is_reached_and_every_state_but_the_ends_is_left(table, named):
    """A job's ends are never left. An attempt's one end is `fenced`: a beat fences even one
    that ended or handed off (BEAT answers 0 for an ended job, as the reaper's ABANDON)."""
    names = {s.name for s in named}
    reached = {t for m in table for t in m.targets}
    left = {s for m in table for s in m.sources if set(m.targets) - {s}}
    assert not any(set(m.targets) & set(m.sources) for m in table), "a move that may stay says so"
    assert {s for m in table for s in m.sources} | reached <= names
    assert reached == names
    ends = {s.name for s in named if s.ended} if table is states.JOB_MOVES else {"fenced"}
    assert left == {s.name for s in named} - ends
    assert all(set(m.keeps) <= names - set(m.sources) for m in table)


def test_job_status_is_derived_from_the_job_states_and_keeps_its_wire_values():
    assert (JobStatus.QUEUED, JobStatus.RUNNING) == ("queued", "running")  # in every job hash
    assert JobStatus.ENDED == ("done", "failed", "cancelled") == states.ENDED_STATUSES
    assert ("queued", "running", *JobStatus.ENDED) == states.STATUSES
    assert {s.status for s in states.JOB_STATES if s.name in states.WAITING_STATES} == {JobStatus.QUEUED}


def test_the_worker_logs_the_attempt_states_it_ends_in_by_their_declared_words():
    from worker.attempts.rules import Outcome

    assert (Outcome.STARTED, Outcome.FENCED, Outcome.HANDED_OFF) == ("started", "fenced", "handed-off")
    assert life.FENCED.outcome == Outcome.FENCED and life.HANDED_OFF.outcome == Outcome.HANDED_OFF


# Each move run on fakeredis with its real scripts. `where` reads back the job's state from
# Redis, in the table's names, and `attempt_state` an attempt's; `Life.moved` checks that
# the table has the move from the state before to the state read back.


def moves(table: str, *names: str):
    """Mark a test as running these moves (the last test checks that each move has one)."""

    def mark(test):
        TESTED.update((table, n) for n in names)
        return test

    return mark


def where(r: redis.Redis, job_id: str) -> str:
    job = {k.decode(): v.decode() for k, v in r.hgetall(keys.job(job_id)).items()}
    if job.get(JobField.ENDED) == "1" or job[JobField.STATUS] == JobStatus.RUNNING:
        return job[JobField.STATUS]
    rq_id = keys.rq_job_id(job_id, int(job.get(JobField.EPOCH, 0)))
    if r.zscore(keys.pending(keys.shard(job_id)), job_id) is not None:
        return "pending"
    if r.hexists(keys.inbox(WORKER), rq_id):
        return "taken"
    for queue in tiers.worker_queue_names(MODEL, WORKER):
        if rq_id.encode() in r.lrange(keys.rq_queue_key(queue), 0, -1):
            if queue == tiers.suspect_queue_name(MODEL):
                return "suspect"
            return "routed" if "@" in queue else "continuation" if "__a" in rq_id else "queued"
    raise AssertionError(f"{job_id} is nowhere: {job}")


def attempt_state(r: redis.Redis, job_id: str, claim: attempts.Claim) -> str:
    epoch, token, ended, seq, suspect, cancel_at = r.hmget(
        keys.job(job_id),
        *(JobField.EPOCH, JobField.CLAIM, JobField.ENDED, JobField.SEQ, JobField.SUSPECT, JobField.CANCEL_AT),
    )
    if int(epoch) != claim.epoch or token.decode() != claim.token:
        return "fenced"
    if ended == b"1":
        return "ended"
    if not r.exists(keys.alive(job_id)):
        return "dead"
    if cancel_at is not None and int(cancel_at) <= time.time() * 1000:
        return "stopping"  # yielding is in the worker's memory only: tested on its Attempt
    return "claimed" if int(seq) == 0 else "proving" if suspect == b"1" else "running"


def the_move(table: tuple[states.Move, ...], name: str) -> states.Move:
    (found,) = [m for m in table if m.name == name]
    return found


class Life:
    """One job, or one attempt at it, whose each move is checked against the table."""

    def __init__(self, r: redis.Redis, job_id: str, claim: attempts.Claim | None = None) -> None:
        self.r, self.job_id, self.claim, self.state = r, job_id, claim, ""

    def now(self) -> str:
        return (
            where(self.r, self.job_id)
            if self.claim is None
            else attempt_state(self.r, self.job_id, self.claim)
        )

    def moved(self, name: str) -> str:
        move = the_move(states.JOB_MOVES if self.claim is None else life.ATTEMPT_MOVES, name)
        now = self.now()
        assert (self.state in move.sources) if self.state else not move.sources, (name, self.state)
        assert now in move.targets or (move.stays and now == self.state), (name, self.state, now)
        self.state = now
        return now

    def at(self, state: str) -> Life:
        """Start from a state reached by the helpers (checked: it is read back)."""
        assert self.now() == state
        self.state = state
        return self


@pytest.fixture
def r():
    return fakeredis.FakeRedis()


JOB = "chatcmpl-1"


def record(r, start_by_ms: int = 0) -> Life:
    """RECORD the job as the API does, with what the scripts here read."""
    spec = {"id": JOB, "model": MODEL, "priority": "default"}
    job = {
        JobField.MODEL: MODEL,
        JobField.STATUS: JobStatus.QUEUED,
        JobField.EPOCH: 0,
        JobField.SPEC: json.dumps(spec),
        JobField.DIGEST: "d",
        JobField.START_BY: start_by_ms or int(time.time() * 1000) + 60_000,
    }
    made = r.register_script(jobs.RECORD)(
        keys=[keys.job(JOB), keys.pending(keys.shard(JOB))],
        args=[JOB, 600, *(str(x) for pair in job.items() for x in pair)],
    )
    assert made == 1
    return Life(r, JOB)


def enqueue(r, worker: str | None = None) -> None:
    spec = json.loads(r.hget(keys.job(JOB), JobField.SPEC))
    queueing.enqueue(Servers(r, r), spec, 0, RECOVERY, worker=worker, deadline_ms=1)


def take(r) -> bytes:
    names = tiers.worker_queue_names(MODEL, WORKER)
    taken = r.register_script(queues.TAKE)(
        keys=queues.take_keys(names, WORKER), args=queues.take_args(names, tiers.suspect_queue_name(MODEL), 0)
    )
    return taken[1]


def claim(r) -> tuple[attempts.Claim, int]:
    """CLAIM the job, as a worker does; returns the claim and whether the job is a suspect."""
    token = uuid.uuid4().hex
    epoch, _, suspect, _ = r.register_script(attempts.CLAIM)(
        keys=library.job_keys(JOB), args=attempts.claim_args(WORKER, JOB, 3000, 60, token, "d")
    )
    return attempts.Claim(epoch, token, WORKER, 3000), suspect


def append(r, c: attempts.Claim, first: int, *batch) -> list:
    args = attempts.append_args(JOB, c, first, [("*", e) for e in batch], 60)
    return r.register_script(attempts.APPEND)(keys=library.job_keys(JOB), args=args)


def started(r, c: attempts.Claim) -> None:
    append(r, c, 0, Started(epoch=c.epoch, worker=WORKER, prompt_tokens=3))


def finished(c: attempts.Claim, reason: str = "stop") -> Finished:
    return Finished(epoch=c.epoch, finish_reason=reason, prompt_tokens=3, completion_tokens=1)


def running(r) -> tuple[Life, attempts.Claim]:
    """A job whose attempt has written its Started entry."""
    record(r)
    enqueue(r)
    take(r)
    c, _ = claim(r)
    started(r, c)
    return Life(r, JOB).at("running"), c


def abandon(r, c: attempts.Claim, reason: str = "crash", **kw) -> queueing.Abandonment:
    return queueing.abandon(Servers(r, r), JOB, c.epoch, RECOVERY, reason, **kw)


def end(r, entry) -> int:
    return r.register_script(jobs.END)(
        keys=library.job_keys(JOB), args=jobs.end_args(JOB, entry, 60, JobStatus.QUEUED)
    )


@moves("job", "record", "enqueue", "take", "claim", "finish")
@moves("attempt", "claim", "start", "end")
def test_the_main_path_pending_queued_taken_running_done(r):
    job = record(r)
    assert job.moved("record") == "pending"
    enqueue(r)
    assert job.moved("enqueue") == "queued"
    assert take(r) == JOB.encode() and job.moved("take") == "taken"
    c, suspect = claim(r)
    attempt = Life(r, JOB, c)
    assert job.moved("claim") == "running" and attempt.moved("claim") == "claimed" and not suspect
    started(r, c)
    assert attempt.moved("start") == "running"
    append(r, c, 1, Delta(epoch=c.epoch, text="hi", token_ids=(7,)))
    append(r, c, 2, finished(c))
    assert job.moved("finish") == "done" and attempt.moved("end") == "ended"


@moves("job", "route", "fall back")
def test_a_routed_job_falls_back_to_the_shared_queue(r):
    job = record(r).at("pending")
    enqueue(r, worker=WORKER)
    assert job.moved("route") == "routed"
    routed = keys.rq_queue_key(tiers.routed_queue_name(MODEL, "default", WORKER))
    back = r.register_script(queues.FALL_BACK)(
        keys=[routed, keys.queue_key(MODEL), keys.wake(MODEL), keys.routed(MODEL), keys.STATS],
        args=[JOB, tiers.routed_member(JOB, WORKER, "default"), "fallbacks", keys.rq_job("")],
    )
    assert back == 1 and job.moved("fall back") == "queued"


@moves("job", "rescue")
def test_a_job_left_pending_is_rescued(r):
    job = record(r).at("pending")
    assert queueing.rescue(Servers(r, r), JOB, RECOVERY) and job.moved("rescue") == "queued"


@moves("job", "put back")
def test_what_a_dead_worker_took_and_never_claimed_is_put_back():
    import asyncio

    from api.jobs.store import JobStore

    server = fakeredis.FakeServer()
    r, aio = fakeredis.FakeRedis(server=server), fakeredis.FakeAsyncRedis(server=server)
    job = record(r)
    enqueue(r)
    take(r)
    job.at("taken")
    store = JobStore(Servers(aio, aio), Servers(r, r), queue_wait_s=60, recovery=RECOVERY)
    assert asyncio.run(store.return_inbox(WORKER)) == 1 and job.moved("put back") == "queued"


@moves("job", "cancel")
def test_a_waiting_job_is_cancelled_at_once(r):
    job = record(r)
    enqueue(r)
    job.at("queued")
    stopped = Finished(epoch=0, finish_reason=CANCELLED, prompt_tokens=0, completion_tokens=0)
    assert end(r, stopped) == 1 and job.moved("cancel") == "cancelled"


@moves("job", "stop")
def test_a_running_job_is_stopped_by_its_attempt_once_a_cancel_is_due(r):
    job, c = running(r)
    r.hset(keys.job(JOB), JobField.CANCEL_AT, 0)  # as the API's cancel sets it
    cancel, _ = append(r, c, 1, Delta(epoch=c.epoch, text="a", token_ids=(1,)))
    assert cancel == 1  # APPEND's reply tells the attempt
    append(r, c, 2, finished(c, CANCELLED))
    assert job.moved("stop") == "cancelled"


@moves("job", "time out")
def test_a_job_no_worker_started_by_its_deadline_fails(r):
    job = record(r, start_by_ms=1)
    enqueue(r)
    job.at("queued")
    assert r.register_script(jobs.END_IF_LATE)(
        keys=library.job_keys(JOB), args=jobs.end_if_late_args(JOB, 60)
    )
    assert job.moved("time out") == "failed"


@moves("job", "claim")
def test_a_new_job_claimed_past_its_deadline_fails_instead(r):
    job = record(r, start_by_ms=1)
    enqueue(r)
    take(r)
    job.at("taken")
    c, _ = claim(r)
    assert c.epoch == 0 and job.moved("claim") == "failed"


@moves("job", "refuse")
def test_a_job_a_worker_cannot_run_is_ended(r):
    job = record(r)
    enqueue(r)
    take(r)
    job.at("taken")
    assert end(r, errors.MODEL_NOT_FOUND.entry("This worker serves another model.")) == 1
    assert job.moved("refuse") == "failed"


@moves("job", "finish")
def test_an_attempt_fails_its_own_job_when_redis_is_full(r):
    """FAIL ends the job as END does, moving the epoch on: only its reply tells the attempt
    that it ended the job itself."""
    job, c = running(r)
    failed = r.register_script(attempts.FAIL)(
        keys=library.job_keys(JOB), args=attempts.fail_args(JOB, c, errors.STORAGE_FULL.entry(), 60)
    )
    assert failed == 1 and job.moved("finish") == "failed"


@moves("job", "hand off")
@moves("attempt", "hand off", "fence")
def test_a_handed_off_job_is_a_continuation_and_its_attempt_is_fenced(r):
    job, c = running(r)
    attempt = Life(r, JOB, c).at("running")
    assert abandon(r, c, "handoff", charge=False).outcome == 1
    assert job.moved("hand off") == "continuation"
    assert attempt.now() == "fenced"  # in Redis: its worker knows it handed off
    with pytest.raises(redis.ResponseError, match="FENCED"):
        append(r, c, 1, Delta(epoch=c.epoch, text="late", token_ids=(1,)))
    assert attempt.moved("fence") == "fenced"
    assert "handed-off" in the_move(life.ATTEMPT_MOVES, "hand off").targets


@moves("attempt", "beat", "die", "reap")
@moves("job", "reap")
def test_a_dead_attempt_is_found_and_its_job_taken_over(r):
    job, c = running(r)
    attempt = Life(r, JOB, c).at("running")
    beat = r.register_script(attempts.BEAT)
    assert beat(keys=[keys.job(JOB), keys.alive(JOB)], args=[c.epoch, 3000, c.token]) == 1
    assert attempt.moved("beat") == "running"
    r.delete(keys.alive(JOB))  # its heartbeat expired
    ids, _ = r.register_script(jobs.INDEXES)(keys=jobs.index_keys(cluster=False)[0], args=["", 0])
    assert JOB.encode() in ids and attempt.moved("die") == "dead"
    assert abandon(r, c, charge=True, suspect_after=2).outcome == 1
    assert job.moved("reap") == "continuation" and attempt.moved("reap") == "fenced"
    assert beat(keys=[keys.job(JOB), keys.alive(JOB)], args=[c.epoch, 3000, c.token]) == 0


@moves("job", "reap", "take", "claim")
@moves("attempt", "start", "clear")
def test_a_job_standing_still_at_its_death_becomes_a_suspect_and_its_takeover_proves_it(r):
    job, c = running(r)
    abandon(r, c, charge=True, suspect_after=1)  # it ran alone: one stall makes it a suspect
    assert job.moved("reap") == "suspect"
    take(r)
    assert job.moved("take") == "taken"
    again, suspect = claim(r)
    attempt = Life(r, JOB, again)
    assert suspect == 1 and job.moved("claim") == "running" and attempt.moved("claim") == "claimed"
    started(r, again)
    assert attempt.moved("start") == "proving"
    cleared = r.register_script(attempts.CLEAR_SUSPECT)(keys=[keys.job(JOB)], args=[again.epoch, again.token])
    assert cleared == 1 and attempt.moved("clear") == "running"


@moves("job", "reap")
def test_a_suspect_that_dies_among_suspects_waits_again_in_a_group_half_as_large(r):
    job, c = running(r)
    abandon(r, c, charge=True, suspect_after=1)
    take(r)
    again, _ = claim(r)
    started(r, again)
    job.at("running")
    done = abandon(r, again, charge=False, group=4)  # its worker died stepping 4 suspects
    assert (done.outcome, done.suspect, done.group) == (1, True, 2) and job.moved("reap") == "suspect"


@moves("job", "reap")
def test_a_job_whose_charged_deaths_are_used_up_fails_with_worker_lost(r):
    job, c = running(r)
    r.hset(keys.job(JOB), JobField.CHARGED, RECOVERY.max_attempts - 1)
    assert abandon(r, c, charge=True, suspect_after=2).outcome == 2
    assert job.moved("reap") == "failed"


def held(c: attempts.Claim, suspect: bool = False):
    """The worker's own Attempt at the claim: it moves by the table's names, as Redis answers."""
    from worker.attempts.attempt import Attempt

    made = Attempt(JOB, c.epoch, from_suspects=suspect, token=c.token, worker=c.worker, window_ms=c.window_ms)
    assert made.state == "claimed" and made.move("start") == ("proving" if suspect else "running")
    return made


def beat(r, c: attempts.Claim) -> int:
    keyed = [keys.job(JOB), keys.alive(JOB)]
    return r.register_script(attempts.BEAT)(keys=keyed, args=[c.epoch, 3000, c.token])


@moves("attempt", "cancel", "end")
def test_a_cancel_due_stops_the_attempt_which_then_ends_its_job_cancelled(r):
    job, c = running(r)
    attempt, worker = Life(r, JOB, c).at("running"), held(c)
    r.hset(keys.job(JOB), JobField.CANCEL_AT, 0)  # as the API's cancel sets it
    cancel, _ = append(r, c, 1, Delta(epoch=c.epoch, text="a", token_ids=(1,)))
    assert cancel == 1 and attempt.moved("cancel") == "stopping" == worker.move("cancel")
    append(r, c, 2, finished(c, CANCELLED))
    assert attempt.moved("end") == "ended" == worker.move("end") and job.now() == "cancelled"
    assert worker.cancelled and worker.ended and not worker.fenced


@moves("attempt", "preempt", "hand off")
def test_a_preempted_attempt_yields_then_hands_its_job_off_uncharged(r):
    job, c = running(r)
    worker = held(c)
    assert worker.move("preempt") == "yielding" and worker.preempted
    assert Life(r, JOB, c).now() == "running"  # Redis does not know: it is the worker's memory
    assert abandon(r, c, queueing.PREEMPT, charge=False).outcome == 1
    assert worker.move("hand off") == "handed-off" and job.moved("hand off") == "continuation"
    assert beat(r, c) == 0 and worker.move("fence") == "fenced" and worker.preempted


@moves("attempt", "fence")
def test_a_beat_after_the_attempt_s_own_end_fences_it_and_it_stays_ended(r):
    job, c = running(r)
    worker = held(c)
    append(r, c, 1, finished(c))
    assert worker.move("end") == "ended" and job.now() == "done"
    assert beat(r, c) == 0  # BEAT answers 0 once the job ended
    assert worker.move("fence") == "fenced" and worker.ended


@moves("attempt", "clear")
def test_a_suspect_s_attempt_proves_then_is_cleared_in_the_worker_too(r):
    _, c = running(r)
    abandon(r, c, charge=True, suspect_after=1)
    take(r)
    again, suspect = claim(r)
    started(r, again)
    worker = held(again, suspect=bool(suspect))
    assert worker.state == "proving" and worker.suspect and Life(r, JOB, again).now() == "proving"
    r.register_script(attempts.CLEAR_SUSPECT)(keys=[keys.job(JOB)], args=[again.epoch, again.token])
    assert worker.move("clear") == "running" == Life(r, JOB, again).now() and not worker.suspect


def test_every_move_is_run_by_a_test_here():
    declared = {("job", m.name) for m in states.JOB_MOVES} | {("attempt", m.name) for m in life.ATTEMPT_MOVES}
    assert declared == TESTED
