"""The job runner with a scripted engine on fakeredis: fresh runs, resumes, fencing, hand-off."""

from __future__ import annotations

import json
import threading

import fakeredis
import pytest
import redis

from contract import entries, keys, tiers
from contract.entries import Delta, Failed, Finished, Started
from contract.jobspec import JobSpec, Message, digest
from contract.keys import JobField, JobStatus
from contract.settings import Recovery
from worker.attempts.attempt import Claims
from worker.attempts.heartbeat import Heartbeat
from worker.attempts.publisher import Publisher
from worker.attempts.rules import Outcome
from worker.attempts.runner import JobRunner
from worker.engine.synthetic import ScriptedEngine
from worker.errors import PromptTooLong
from worker.redis.link import Link
from worker.text.replies import PlainReply

RECOVERY = Recovery(retention_s=60)

CID = "chatcmpl-run"
PROMPT = list(ScriptedEngine.PROMPT)
EOS = 0

CONTINUATIONS = keys.rq_queue_key(tiers.queue_name("m", tiers.PRIORITIES[0]))  # first taken


class TooLongEngine(ScriptedEngine):
    """Every prompt is over its context."""

    def prompt_ids(self, spec):
        raise PromptTooLong(99, self.n_ctx, "messages")


def since(engine: ScriptedEngine) -> list[int]:
    """When each generation's stream last moved (0: a first attempt)."""
    return [job.since_ms for job in engine.asked]


def spec(**kw) -> dict:
    base = dict(id=CID, kind="chat", model="m", messages=(Message("user", "hi"),), max_tokens=5)
    base.update(kw)
    return JobSpec(**base).to_dict()


@pytest.fixture
def r():
    client = fakeredis.FakeRedis()
    client.hset(
        keys.job(CID),
        mapping={
            JobField.STATUS: "queued",
            JobField.EPOCH: 0,
            JobField.ATTEMPTS: 0,
            JobField.SPEC: json.dumps(spec()),
        },
    )
    return client


def runner(r, engine, shutdown_grace_s: float = 20.0, log_content: bool = False, slots: int = 1) -> JobRunner:
    """A runner wired as worker/__main__.py wires it."""
    link = Link(r, "w1", Recovery())
    heartbeat = Heartbeat(r, 3000, 1.0)
    return JobRunner(
        engine,
        link,
        heartbeat,
        3000,
        shutdown_grace_s=shutdown_grace_s,
        log_content=log_content,
        slots=slots,
    )


def record(r, raw: dict) -> None:
    """What the API records of the job this spec describes (the worker runs no other spec)."""
    r.hset(keys.job(raw["id"]), mapping={JobField.SPEC: json.dumps(raw), JobField.DIGEST: digest(raw)})


def run_one(run: JobRunner, raw: dict) -> Outcome:
    """As the worker loop runs a job: reserve a slot, start it, then wait for its attempt."""
    if run.link.client.exists(keys.job(raw["id"])):
        record(run.link.client, raw)
    assert run.reserve(timeout=1)
    outcome = run.start(raw, raw["id"])
    run.drain(timeout=10)
    return outcome


def last_entry(r):
    return stream(r)[-1]


def stream(r):
    return [entries.decode(f) for _, f in r.xrange(keys.events(CID))]


def test_fresh_job_publishes_started_deltas_and_usage(r):
    assert run_one(runner(r, ScriptedEngine([7, 8, EOS])), spec()) == Outcome.STARTED
    s = stream(r)
    assert isinstance(s[0], Started) and s[0].prompt_tokens == 3
    assert [e.text for e in s if isinstance(e, Delta)] == ["<7>", "<8>"]
    assert s[-1] == Finished(epoch=s[-1].epoch, finish_reason="stop", prompt_tokens=3, completion_tokens=2)


@pytest.mark.parametrize(("held", "cached"), [(2, 2), (9, len(PROMPT))])  # of the prompt: not what followed
def test_the_usage_says_how_much_of_the_prompt_the_slot_s_cache_held(r, held, cached):
    run_one(runner(r, ScriptedEngine([7, EOS], cached_tokens=held)), spec())
    assert stream(r)[-1].cached_tokens == cached


class SlowPrefillEngine(ScriptedEngine):
    """Reads its prompt over steps that take longer, together, than the heartbeat's stall
    window, saying so after each; the heartbeat beats just before the first token."""

    def __init__(self, script, heartbeat: Heartbeat) -> None:
        super().__init__(script)
        self.heartbeat = heartbeat

    def tokens(self, job):
        for _ in range(4):
            threading.Event().wait(0.1)
            if job.progress is not None:
                job.progress()
        self.heartbeat.beat()
        yield from super().tokens(job)


class EndingEngine(ScriptedEngine):
    """Records what the stream held when its side of the job ended (the real engine writes
    what the slot holds for routing then), while something else still refers to the job."""

    def __init__(self, script, r):
        super().__init__(script)
        self.r, self.live, self.ended_with = r, [], None

    def tokens(self, job):
        gen = self._tokens(job)
        self.live.append(gen)  # as a scheduler's list would: breaking out does not end it
        return gen

    def _tokens(self, job):
        try:
            yield from super().tokens(job)
        finally:
            self.ended_with = [type(e).__name__ for e in stream(self.r)]


def test_the_engine_s_end_of_the_job_comes_before_the_terminal_entry(r):
    engine = EndingEngine([5, 6, EOS, 7], r)
    run_one(runner(r, engine), spec())
    assert engine.ended_with[0] == "Started"
    assert "Finished" not in engine.ended_with  # a conversation's next turn may come at once
    assert isinstance(last_entry(r), Finished)


def test_a_prompt_read_over_many_steps_is_progress_not_a_stall(r, caplog):
    heartbeat = Heartbeat(r, 3000, 1.0, stall_s=0.25)
    run = JobRunner(SlowPrefillEngine([7, EOS], heartbeat), Link(r, "w1", Recovery()), heartbeat, 3000)
    assert run_one(run, spec()) == Outcome.STARTED
    assert not [rec for rec in caplog.records if "made no progress" in rec.getMessage()]
    assert last_entry(r).finish_reason == "stop"


def test_max_tokens_ends_with_length(r):
    run_one(runner(r, ScriptedEngine([1, 2, 3, 4, 5, 6, 7])), spec(max_tokens=3))
    assert stream(r)[-1].finish_reason == "length" and stream(r)[-1].completion_tokens == 3


# the first attempt's thread ends with the SystemExit the engine raises, as a dying worker's would
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_continuation_resumes_from_the_published_token_ids(r):
    # attempt 1 publishes two tokens, then its worker dies (the reaper abandons it)
    def die(i):
        if i == 2:
            raise SystemExit

    first = runner(r, ScriptedEngine([11, 12, 13, 14], on_token=die))
    run_one(first, spec(max_tokens=5))  # SystemExit ends the attempt's thread after the hand-off
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"  # handed off on the way out
    assert r.llen(CONTINUATIONS) == 1  # with a continuation job
    # attempt 2 continues: prompt + exactly the published ids, only 3 more tokens
    engine = ScriptedEngine([21, 22, 23, 24, 25])
    run_one(runner(r, engine), spec(max_tokens=5))
    assert last_entry(r).finish_reason == "length"
    assert engine.contexts == [[*PROMPT, 11, 12]]
    s = stream(r)
    first_deltas = [i for i, f in r.xrange(keys.events(CID)) if isinstance(entries.decode(f), Delta)][:-3]
    moved = int(first_deltas[-1].decode().split("-")[0])  # attempt 1's last Delta: its stream stalled then
    assert since(first.rules.engine) == [0] and since(engine) == [moved]  # read by how long it stalled
    assert "".join(e.text for e in s if isinstance(e, Delta)) == "<11><12><21><22><23>"
    assert sum(isinstance(e, Started) for e in s) == 2
    assert s[-1].completion_tokens == 5 and s[-1].prompt_tokens == 3


THOUGHT = {11: "Hmm", 12: ", so", 13: "</think>", 14: "\n\n", 15: "Yes", 16: "."}


class BudgetEngine(ScriptedEngine):
    """Thinks on until its block is closed for it, then answers (a new script per call)."""

    def __init__(self, scripts: list[list[int]]) -> None:
        super().__init__(scripts[0], words=THOUGHT, opened=True)
        self.scripts = scripts

    def close_thinking(self, spec):
        return [13, 14]  # "</think>", "\n\n"

    def tokens(self, job):
        self.script = self.scripts[min(len(self.contexts), len(self.scripts) - 1)]
        return super().tokens(job)


def test_a_thinking_budget_closes_the_block_and_the_answer_goes_on(r):
    engine = BudgetEngine([[11, 12, 11, 12, 11, 12, EOS], [15, 16, EOS]])
    run_one(runner(r, engine), spec(max_tokens=20, thinking_budget=3))
    assert split(stream(r)) == ("Hmm, soHmm", "Yes.")
    assert engine.contexts[1] == [*PROMPT, 11, 12, 11, 13, 14]  # it goes on after the close
    ids = [t for e in stream(r) if isinstance(e, Delta) for t in e.token_ids]
    assert ids == [11, 12, 11, 13, 14, 15, 16]  # the close is the job's tokens: a resume reads it
    assert last_entry(r).completion_tokens == 7 and last_entry(r).reasoning_tokens == 5


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_continuation_past_its_budget_closes_the_block_first(r):
    """As if an attempt died after its budget's last token, before the close was written (here
    the first attempt had no budget: its worker dies at its fourth token)."""

    def die(i):
        if i == 3:
            raise SystemExit

    first = BudgetEngine([[11, 12, 11, 12, EOS]])
    first.on_token = die
    run_one(runner(r, first), spec(max_tokens=20))
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    rest = BudgetEngine([[15, 16, EOS]])
    run_one(runner(r, rest), spec(max_tokens=20, thinking_budget=3))
    assert rest.contexts == [[*PROMPT, 11, 12, 11, 13, 14]]  # closed before the engine was asked
    assert split(stream(r)) == ("Hmm, soHmm", "Yes.")


def test_no_budget_no_close(r):
    engine = BudgetEngine([[11, 12, 11, EOS]])
    run_one(runner(r, engine), spec(max_tokens=20))
    assert len(engine.contexts) == 1 and split(stream(r)) == ("Hmm, soHmm", "")


class CallingReply(PlainReply):
    calls = 1  # a tool call was made: a stop ends the job with "tool_calls"


def test_a_job_that_made_a_tool_call_ends_with_tool_calls_and_nothing_after(r, caplog):
    engine = ScriptedEngine([7, 8, EOS])
    engine.reply = lambda spec, prompt: CallingReply()  # type: ignore[method-assign]
    run_one(runner(r, engine), spec())
    terminal = [e for e in stream(r) if entries.is_terminal(e)]
    assert len(terminal) == 1 and terminal[0].finish_reason == "tool_calls"
    assert "generation failed" not in caplog.text


def split(s: list) -> tuple[str, str]:
    deltas = [e for e in s if isinstance(e, Delta)]
    return "".join(e.reasoning for e in deltas), "".join(e.text for e in deltas)


def test_thinking_is_published_apart_from_the_answer_and_its_tokens_counted(r):
    engine = ScriptedEngine([11, 12, 13, 14, 15, 16, EOS], words=THOUGHT, opened=True)
    run_one(runner(r, engine), spec(max_tokens=10))
    assert split(stream(r)) == ("Hmm, so", "Yes.")
    assert last_entry(r).reasoning_tokens == 4 and last_entry(r).completion_tokens == 6


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("dies_at", [1, 2, 3, 5])
def test_a_continuation_splits_thinking_and_answer_as_an_uninterrupted_run(r, dies_at):
    """Killed mid-thinking, on its closing tag, or mid-answer: the same split and count."""

    def die(i):
        if i == dies_at:
            raise SystemExit

    script = [11, 12, 13, 14, 15, 16, EOS]
    run_one(runner(r, ScriptedEngine(script, on_token=die, words=THOUGHT, opened=True)), spec(max_tokens=10))
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    rest = ScriptedEngine(script[dies_at:], words=THOUGHT, opened=True)
    run_one(runner(r, rest), spec(max_tokens=10))
    assert sum(isinstance(e, Started) for e in stream(r)) == 2
    assert split(stream(r)) == ("Hmm, so", "Yes.")
    assert last_entry(r).reasoning_tokens == 4 and last_entry(r).completion_tokens == 6


def test_a_continuation_with_nothing_left_finishes_at_once(r):
    pub = Publisher(Link(r, "w0", RECOVERY))
    record(r, spec(max_tokens=3))
    a = Claims(Link(r, "w0", RECOVERY), 3000).claim(CID, digest(spec(max_tokens=3)))
    pub.started(a, 3)
    pub.delta(a, "abc", (1, 2, 3))
    pub.flush(a)
    # as ABANDON does
    r.hset(keys.job(CID), mapping={JobField.EPOCH: a.epoch + 1, JobField.STATUS: JobStatus.QUEUED})
    r.delete(keys.alive(CID))
    engine = ScriptedEngine([9])
    run_one(runner(r, engine), spec(max_tokens=3))
    assert engine.contexts == [] and stream(r)[-1].finish_reason == "length"


def test_fenced_by_the_heartbeat_stops_within_one_token(r):
    holder = {}

    def fence(i):
        if i == 1:
            holder["runner"].heartbeat.beat()  # sees the epoch moved on

    engine = ScriptedEngine([1, 2, 3, 4], on_token=fence)
    holder["runner"] = run = runner(r, engine)
    orig_claim = run.claims.claim

    def claim_then_steal(job_id, spec_digest):
        attempt = orig_claim(job_id, spec_digest)
        run.heartbeat.track(attempt)
        r.hincrby(keys.job(CID), JobField.EPOCH, 1)  # another attempt takes over
        return attempt

    run.claims.claim = claim_then_steal
    run_one(run, spec())
    assert stream(r) == []  # the fenced attempt wrote nothing


def test_shutdown_hands_the_job_off_with_a_continuation(r):
    run = runner(r, ScriptedEngine([1, 2, 3, 4]), shutdown_grace_s=0.0)
    run.request_shutdown()
    run_one(run, spec())
    assert r.hget(keys.job(CID), JobField.STATUS) == b"queued"
    assert r.llen(CONTINUATIONS) == 1


def test_prompt_rejected_is_a_failed_entry(r):
    run_one(runner(r, TooLongEngine([1])), spec())
    last = stream(r)[-1]
    assert isinstance(last, Failed) and last.code == "context_length_exceeded" and last.param == "messages"


def test_job_for_another_model_is_ended_not_run(r):
    engine = ScriptedEngine([1])
    assert run_one(runner(r, engine), spec(model="other")) == Outcome.WRONG_MODEL
    assert engine.contexts == [] and stream(r)[-1].code == "model_not_found"


def test_a_claim_that_fails_ends_the_job_instead_of_leaving_it_queued(r, monkeypatch):
    # e.g. a Redis ACL that refuses a command inside CLAIM: the client must not wait for the
    # queue deadline (found by tests/integration/test_redis_security.py)
    run = runner(r, ScriptedEngine([1, EOS]))
    record(r, spec())

    def refused(**kw):
        raise redis.ResponseError("ACL failure in script: no permissions to run the 'time' command")

    monkeypatch.setattr(run.claims, "_claim", refused)
    assert run.reserve(timeout=1)
    with pytest.raises(redis.ResponseError):
        run.start(spec(), CID)
    assert run.reserve(timeout=1)  # the slot came back
    last = stream(r)[-1]
    assert isinstance(last, Failed) and last.code == "worker_error"
    assert r.hget(keys.job(CID), JobField.STATUS) == b"failed"


def test_content_is_logged_only_when_asked(r, caplog):
    caplog.set_level("INFO")
    run_one(runner(r, ScriptedEngine([7, 8, EOS])), spec())
    assert "<7><8>" not in caplog.text and "LOG_CONTENT" not in caplog.text
    r.delete(keys.job(CID), keys.events(CID))
    r.hset(keys.job(CID), mapping={JobField.STATUS: "queued", JobField.EPOCH: 0, JobField.ATTEMPTS: 0})
    run_one(runner(r, ScriptedEngine([7, 8, EOS]), log_content=True), spec())
    assert "LOG_CONTENT" in caplog.text and "<7><8>" in caplog.text


def queued_job(r, job_id: str) -> dict:
    s = spec(id=job_id)
    r.hset(
        keys.job(job_id),
        mapping={
            JobField.STATUS: "queued",
            JobField.EPOCH: 0,
            JobField.ATTEMPTS: 0,
            JobField.SPEC: json.dumps(s),
            JobField.DIGEST: digest(s),
        },
    )
    return s


class GatedEngine(ScriptedEngine):
    """Every job waits at its first token until the test opens the gate."""

    def __init__(self, script):
        super().__init__(script)
        self.gate = threading.Event()
        self.inside = threading.Semaphore(0)

    def tokens(self, job):
        self.inside.release()
        self.gate.wait(10)
        yield from super().tokens(job)


def test_slots_run_jobs_side_by_side_and_free_up_when_they_end(r):
    engine = GatedEngine([5, 6, EOS])
    run = runner(r, engine, slots=2)
    jobs = [queued_job(r, f"chatcmpl-{i}") for i in range(2)]
    for j in jobs:
        assert run.reserve(timeout=1)
        assert run.start(j, j["id"]) == Outcome.STARTED
    assert not run.reserve(timeout=0.05)  # both slots taken
    assert engine.inside.acquire(timeout=5) and engine.inside.acquire(timeout=5)  # both inside at once
    assert run.running() == 2
    engine.gate.set()
    run.drain(timeout=10)
    assert run.running() == 0
    for j in jobs:
        last = entries.decode(r.xrange(keys.events(j["id"]))[-1][1])
        assert isinstance(last, Finished) and last.completion_tokens == 2
    assert run.reserve(timeout=1) and run.reserve(timeout=1)


def test_a_job_that_cannot_start_gives_its_slot_back_at_once(r):
    run = runner(r, ScriptedEngine([1]))
    assert run.reserve(timeout=1)
    missing = spec(id="chatcmpl-missing")
    assert run.start(missing, missing["id"]) == Outcome.SKIPPED  # no job hash: gone
    assert run.reserve(timeout=1)


def test_shutdown_hands_off_every_running_job(r):
    engine = GatedEngine([1, 2, 3, 4])
    run = runner(r, engine, shutdown_grace_s=0.0, slots=3)
    jobs = [queued_job(r, f"chatcmpl-{i}") for i in range(3)]
    for j in jobs:
        run.reserve(timeout=1)
        run.start(j, j["id"])
    for _ in jobs:
        assert engine.inside.acquire(timeout=5)
    run.request_shutdown()
    engine.gate.set()
    run.drain(timeout=10)
    assert [r.hget(keys.job(j["id"]), JobField.STATUS) for j in jobs] == [b"queued"] * 3
    assert r.llen(CONTINUATIONS) == 3  # a continuation for each


def test_idle_time_counts_from_the_last_attempt_s_end(r):
    engine = GatedEngine([5, EOS])
    run = runner(r, engine, slots=2)
    run.reserve(timeout=1)
    run.start(queued_job(r, "chatcmpl-idle"), "chatcmpl-idle")
    assert engine.inside.acquire(timeout=5)
    assert run.idle_for() == 0.0  # a job runs: not idle, however long it takes
    engine.gate.set()
    run.drain(timeout=10)
    assert 0.0 < run.idle_for() < 5.0


def test_a_proof_runs_from_its_first_suspect_to_its_last_cleared(r):
    """No second group of suspects starts while one proves (worker/attempts/proofs.py)."""
    engine = GatedEngine([5, 6, 7, EOS])
    run = runner(r, engine, slots=2)
    assert run.proof_may_start()
    jobs = [queued_job(r, f"chatcmpl-s{i}") for i in range(2)]
    for j in jobs:
        r.hset(keys.job(j["id"]), mapping={JobField.SUSPECT: 1, JobField.GROUP: 0})
        assert run.reserve(timeout=1)
        assert run.start(j, j["id"]) == Outcome.STARTED
    assert engine.inside.acquire(timeout=5) and engine.inside.acquire(timeout=5)
    assert run.running_suspects() == (2, 0)
    assert not run.proof_may_start()
    engine.gate.set()
    run.drain(timeout=10)
    assert run.running_suspects() == (0, 0)
    assert run.proof_may_start()  # nothing read again here: the next group at once


def test_a_terminal_write_refused_for_memory_ends_the_job_storage_full_once(r, monkeypatch):
    """Redis at maxmemory with noeviction refuses the Finished entry: the attempt ends its
    job with a small storage_full entry (FAIL, which a full Redis still takes) rather than
    leave it running for the reaper to requeue into the same wall."""
    run = runner(r, ScriptedEngine([7, 8, EOS]))
    pub = run.publisher
    append_all = pub._append_all

    def full_at_the_end(todo):
        if any(isinstance(e, Finished) for g in todo for e in g.new):
            raise redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
        return append_all(todo)

    monkeypatch.setattr(pub, "_append_all", full_at_the_end)
    run_one(run, spec())
    end = last_entry(r)
    assert isinstance(end, Failed) and end.code == "storage_full", end
    assert r.hget(keys.job(CID), JobField.STATUS) == JobStatus.FAILED.encode()
    assert r.hget(keys.job(CID), JobField.ATTEMPTS) == b"1"
    assert r.zscore(keys.running(keys.shard(CID)), CID) is None and not r.exists(keys.alive(CID))
