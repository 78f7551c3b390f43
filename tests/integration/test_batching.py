"""The batching engine with the real model, in-process: several jobs decoded in one batch
give what they give alone, join and leave a running batch, and share the prefill."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from contract.jobspec import JobSpec
from contract.stats import BatchCounters
from worker.engine.protocol import Generation
from worker.settings import DEFAULT_MODEL_NAME, WorkerSettings

pytestmark = pytest.mark.integration

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "Explain gravity briefly.",
]


def make_engine(slots: int, **env: str):
    from worker.engine.model import LlamaEngine

    base = {"REDIS_URL": "unused", "SLOTS": str(slots), "N_CTX": "2048", "N_THREADS": "2"}
    return LlamaEngine(WorkerSettings.from_env({**base, **env}))


@pytest.fixture(scope="module")
def engine():
    e = make_engine(4)
    yield e
    e.close()


def job(engine, question: str, n: int = 0, **kw) -> JobSpec:
    d = {
        "id": f"chatcmpl-{n}",
        "kind": "chat",
        "model": engine.model_name,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
    }
    return JobSpec.from_dict({**d, **kw})


def generate(engine, spec: JobSpec, limit: int = 40, prior=(), on_token=None) -> list[int]:
    """What the job runner does with the engine: take tokens until the end or the limit."""
    out: list[int] = []
    for pick, _ in engine.tokens(Generation(spec, engine.prompt_ids(spec), list(prior))):
        token = pick.token
        if engine.is_end(token):
            break
        out.append(token)
        if on_token is not None:
            on_token(len(out))
        if len(out) >= limit:
            break
    return out


def concurrently(*calls) -> list:
    results: list = [None] * len(calls)

    def run(i, call):
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.fixture(scope="module")
def alone(engine) -> list[list[int]]:
    """Each question's greedy answer with nothing else in the batch."""
    return [generate(engine, job(engine, q, i)) for i, q in enumerate(QUESTIONS)]


def test_greedy_jobs_in_one_batch_give_what_they_give_alone(engine, alone):
    batched = concurrently(
        *[lambda i=i, q=q: generate(engine, job(engine, q, i)) for i, q in enumerate(QUESTIONS)]
    )
    assert batched == alone
    assert all(len(a) > 5 for a in alone) and len({tuple(a) for a in alone}) == len(alone)


def test_the_single_sequence_engine_gives_the_same_answers(alone):
    single = make_engine(1)
    try:
        assert [generate(single, job(single, q, i)) for i, q in enumerate(QUESTIONS)] == alone
    finally:
        single.close()


def test_a_job_joins_a_running_batch_without_waiting_for_it(engine, alone):
    """The third job starts while the first two are mid-answer, and its answer is unchanged."""
    joined_at: list[int] = []
    third_started = threading.Event()
    first_progress = [0]

    def first():
        def note(n):
            first_progress[0] = n
            if n == 10:
                third_started.set()

        return generate(engine, job(engine, QUESTIONS[0], 0), on_token=note)

    def third():
        third_started.wait(60)
        return generate(
            engine, job(engine, QUESTIONS[2], 2), on_token=lambda n: joined_at.append(first_progress[0])
        )

    a, b, c = concurrently(first, lambda: generate(engine, job(engine, QUESTIONS[1], 1)), third)
    assert [a, b, c] == [alone[0], alone[1], alone[2]]
    assert len(alone[0]) > 12 and joined_at[0] < len(alone[0])  # its first token came mid-way


def test_closing_a_job_frees_its_slot_for_the_next(alone):
    """One slot: a job cancelled after 3 tokens lets the next job run at once."""
    single = make_engine(1)
    try:
        cut = generate(single, job(single, QUESTIONS[3], 3, max_tokens=500), limit=3)
        assert cut == alone[3][:3]
        assert generate(single, job(single, QUESTIONS[0], 0)) == alone[0]
    finally:
        single.close()


def open_a_gap(eng) -> tuple:
    """Slots 0, 1, 2 taken in turn (each job once the one before has a token); the job in
    slot 1 stops after 3 tokens. Returns the three answers."""
    started = [threading.Event(), threading.Event()]

    def nth(i: int, after: threading.Event | None, limit: int = 40):
        def run():
            if after is not None:
                assert after.wait(60)
            on_token = (lambda n: started[i].set()) if i < 2 else None
            return generate(eng, job(eng, QUESTIONS[i], i), limit=limit, on_token=on_token)

        return run

    return concurrently(nth(0, None), nth(1, started[0], limit=3), nth(2, started[1]))


def test_a_job_ending_between_two_others_closes_the_gap_and_changes_no_answer(alone):
    """Slots 0, 1, 2 taken in turn; the job in slot 1 stops after 3 tokens and no job waits:
    the job in slot 2 moves to slot 1 (one pass per step again) and still gives its answer."""
    eng = make_engine(3)
    try:
        a, b, c = open_a_gap(eng)
        assert (a, b, c) == (alone[0], alone[1][:3], alone[2])
        assert eng._scheduler.counters.moves == 1
    finally:
        eng.close()


def test_a_conversation_ending_in_a_gap_keeps_its_cache_in_a_spare_slot(alone):
    """As above with a fourth, empty slot: before the job in slot 2 moves into slot 1, the
    cache the ended job left there (its conversation, whose next turn may be coming) is
    copied to slot 3, and that next turn reads only what is new."""
    eng = make_engine(4)
    try:
        a, b, c = open_a_gap(eng)
        assert (a, b, c) == (alone[0], alone[1][:3], alone[2])
        counters = eng._scheduler.counters
        assert counters.moves == 1 and counters.kept == 1
        spec = job(eng, QUESTIONS[1], 1)
        prompt = eng.prompt_ids(spec)
        before = counters.cached_tokens
        assert generate(eng, spec, limit=5, prior=b) == alone[1][3:8]  # the next turn, as it were
        assert counters.cached_tokens - before >= len(prompt) + 2  # its prompt and answer: cached
    finally:
        eng.close()


@pytest.mark.parametrize("on_device", [False, True], ids=["state copy", "whole-slot copy"])
def test_a_repeated_prompt_reads_only_its_last_token_and_leaves_the_kept_cache_whole(engine, on_device):
    """A prompt run again while the slot that ran it also holds its answer (a conversation
    kept for its next turn): the new job takes an empty slot and copies the shared prefix
    there, so it reads only the prompt's last token, and the kept conversation's next turn
    still reads only what is new. Both ways a prefix is copied: the CPU's (only the cells
    the source holds) and the GPU's (llama.cpp's copy of the whole slot, then the tail cut)."""
    spec = job(engine, QUESTIONS[3], 3, ignore_eos=True)
    reference = generate(engine, spec, limit=45)  # greedy answers do not depend on the cache
    eng = make_engine(4)
    eng._scheduler._context.kv_on_device = on_device
    try:
        counters = eng._scheduler.counters
        prompt = eng.prompt_ids(spec)
        first = generate(eng, spec, limit=40)
        assert first == reference[:40]
        kept = list(eng._scheduler._kv[0])  # slot 0: the prompt and the answer (its last tokens may
        assert kept == [*prompt, *reference[: len(kept) - len(prompt)]]  # be fed before the close)
        assert len(kept) >= len(prompt) + len(first) - 1

        read, cached, computed = counters.prompt_tokens, counters.cached_tokens, counters.prefill_tokens
        again = generate(eng, job(eng, QUESTIONS[3], 4, ignore_eos=True), limit=3)
        assert again == reference[:3]
        assert counters.prompt_tokens - read == len(prompt)
        assert counters.cached_tokens - cached == len(prompt) - 1
        assert counters.prefill_tokens - computed == 1  # the prompt's last token alone
        assert counters.copied == 1
        assert eng._scheduler._kv[0] == kept  # the kept conversation was not evicted

        cached, computed = counters.cached_tokens, counters.prefill_tokens
        assert generate(eng, spec, limit=5, prior=first) == reference[40:45]  # its next turn
        assert counters.cached_tokens - cached == len(prompt) + len(first) - 1
        assert counters.prefill_tokens - computed == 1
    finally:
        eng.close()


def test_a_long_prompt_is_prefilled_in_chunks_while_others_decode(engine):
    """A ~1,500-token prompt takes many steps; a running stream keeps getting tokens meanwhile."""
    long_question = "Summarize: " + " ".join(f"item {i} is blue." for i in range(150))
    running_tokens: list[int] = []
    long_first = threading.Event()
    during: list[int] = []

    def runner():
        def note(n):
            running_tokens.append(n)

        return generate(
            engine,
            job(engine, "Write a long story about a dragon.", 9, temperature=0),
            limit=200,
            on_token=note,
        )

    def long_job():
        while len(running_tokens) < 3:
            threading.Event().wait(0.01)
        start = len(running_tokens)

        def first(n):
            if n == 1:
                during.append(len(running_tokens) - start)
                long_first.set()

        return generate(engine, job(engine, long_question, 8), limit=5, on_token=first)

    story, summary = concurrently(runner, long_job)
    assert len(summary) == 5 and len(story) > 20
    prompt_len = len(engine.prompt_ids(job(engine, long_question, 8)))
    assert prompt_len > 1000
    # prefill took at least prompt_len / 128 steps, each also decoding the running job
    assert during[0] >= prompt_len // 128 - 1


def test_each_step_that_reads_a_long_prompt_is_progress_for_its_job(engine):
    """A prompt read a chunk at a time beside other streams (PREFILL_STRETCH) may take longer
    than STALL_SECONDS to its first token: every step that reads part of it must count as
    progress, or the heartbeat declares an honest prefill hung and the job runs twice."""
    question = "Count these: " + " ".join(f"box {i} is green." for i in range(150))  # not cached
    spec = job(engine, question, 7)
    prompt = engine.prompt_ids(spec)
    steps_before_first: list[int] = []
    progressed = [0]

    def progress() -> None:
        progressed[0] += 1

    for _ in engine.tokens(Generation(spec, prompt, progress=progress)):
        steps_before_first.append(progressed[0])
        break
    # alone on the worker, the prompt is read PREFILL_ALONE tokens a step (the fixture's)
    alone = WorkerSettings.from_env({"REDIS_URL": "unused"}).prefill_alone
    assert steps_before_first[0] >= len(prompt) // alone >= 1


def test_a_resumed_job_continues_from_its_prompt_and_published_tokens(engine, alone):
    """The continuation after k tokens is a coherent greedy continuation of them."""
    k = 5
    spec = job(engine, QUESTIONS[1], 1)
    rest = generate(engine, spec, prior=alone[1][:k], limit=10)
    assert len(rest) == 10 or engine.is_end(rest[-1])
    assert rest[:3] == alone[1][k : k + 3]


def test_steps_of_batch_lines_stopped_part_way_change_no_answer(engine, alone):
    """Batch API lines whose steps an interactive job keeps stopping (worker/engine/interrupt.py)
    give what they give alone: every stopped step is taken out of the cache and planned
    again. An interactive job submitted beside them is answered as alone too."""
    scheduler = engine._scheduler
    before = scheduler.counters.interrupted
    done = threading.Event()

    def interrupter():
        while not done.wait(0.05):
            scheduler._interrupt.fire()  # as a submitted interactive job does

    def line(i: int):
        return generate(engine, job(engine, QUESTIONS[i], i, priority="batch"))

    def interactive():
        time.sleep(0.3)
        return generate(engine, job(engine, QUESTIONS[3], 3))

    thread = threading.Thread(target=interrupter)
    thread.start()
    try:
        answers = concurrently(*[lambda i=i: line(i) for i in range(3)], interactive)
    finally:
        done.set()
        thread.join()
    assert answers == alone
    assert scheduler.counters.interrupted > before


def test_batch_lines_go_on_however_often_interactive_jobs_arrive(engine, alone):
    """Each interactive job cuts a step of Batch API lines short, but a step planned again
    after a cut runs to its end: with jobs arriving faster than any step computes (a loaded
    machine's steps, a busy API's submissions), the lines still move, and give what they
    give alone."""
    scheduler = engine._scheduler
    before = scheduler.counters.interrupted
    done = threading.Event()

    def interrupter():
        while not done.wait(0.001):
            scheduler._interrupt.fire()

    thread = threading.Thread(target=interrupter)
    thread.start()
    try:
        lines = concurrently(
            *[
                lambda i=i: generate(engine, job(engine, QUESTIONS[i], i, priority="batch"), 10)
                for i in range(2)
            ]
        )
    finally:
        done.set()
        thread.join()
    assert lines == [a[:10] for a in alone[:2]]
    assert scheduler.counters.interrupted > before


def test_a_configuration_that_does_not_fit_is_refused_at_start():
    from worker.engine.model import EngineConfigError

    with pytest.raises(EngineConfigError, match="lower SLOTS or N_CTX"):
        make_engine(64, N_CTX="1000000")


def test_a_worker_process_with_a_cache_too_big_exits_at_start_saying_why(tmp_path):
    from devstack.processes import start_worker

    worker = start_worker(tmp_path, "redis://127.0.0.1:1/0", env={"SLOTS": "64", "N_CTX": "1000000"})
    assert worker.popen.wait(timeout=60) != 0
    assert "lower SLOTS or N_CTX" in worker.log() and "MiB" in worker.log()


@pytest.mark.parametrize("failure", ["rc", "exception", "bookkeeping"])
def test_a_failed_step_ends_its_jobs_with_an_error_and_the_engine_goes_on(
    engine, alone, monkeypatch, failure
):
    import llama_cpp

    from worker.engine import batching
    from worker.engine.batching import EngineFailed

    real, real_compaction = llama_cpp.llama_decode, batching.compaction
    calls = {"n": 0}

    def flaky(ctx, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            if failure == "exception":
                raise MemoryError("simulated")
            return 1  # llama.cpp: no KV slot for the batch
        return real(ctx, batch)

    def broken_compaction(running, free):  # a bug in the scheduler's own bookkeeping
        calls["n"] += 1
        if calls["n"] == 3:
            raise IndexError("simulated")
        return real_compaction(running, free)

    if failure == "bookkeeping":
        monkeypatch.setattr(batching, "compaction", broken_compaction)
    else:
        monkeypatch.setattr(llama_cpp, "llama_decode", flaky)
    with pytest.raises(EngineFailed):
        generate(engine, job(engine, QUESTIONS[0], 0))
    monkeypatch.setattr(llama_cpp, "llama_decode", real)
    monkeypatch.setattr(batching, "compaction", real_compaction)
    assert generate(engine, job(engine, QUESTIONS[0], 0)) == alone[0]


def test_warm_up_leaves_no_cache_no_counts_and_no_changed_answer(alone):
    """The warm-up's prompts are not in any slot afterwards (a job with the same prompt
    prefills all of it), its steps are not counted in the metrics, and answers are as before."""
    warmed = make_engine(4)
    try:
        assert warmed.warm_up() > 0
        assert warmed.counters() == BatchCounters()
        from worker.engine.model import WARM_UP_MESSAGE

        spec = dataclasses.replace(job(warmed, "x"), messages=(WARM_UP_MESSAGE,))
        generate(warmed, spec, limit=2)
        assert warmed.counters().prefill_tokens == len(warmed.prompt_ids(spec))
        assert [generate(warmed, job(warmed, q, i)) for i, q in enumerate(QUESTIONS)] == alone
    finally:
        warmed.close()


def test_a_warm_up_cut_short_by_its_budget_still_leaves_a_clean_engine(alone, caplog):
    warmed = make_engine(4)
    try:
        with caplog.at_level("INFO", logger="worker.engine.model"):
            took = warmed.warm_up(budget_s=0.001)
        assert "cut short" in caplog.text
        assert took < 5  # it stops at the next token, and skips what is left
        assert warmed.counters() == BatchCounters()
        assert [generate(warmed, job(warmed, q, i)) for i, q in enumerate(QUESTIONS)] == alone
    finally:
        warmed.close()


def test_a_waiting_job_cuts_the_warm_up_short_or_skips_it(alone, caplog):
    """A job already waiting (a dead worker's, in a crash storm) is not held back by the
    warm-up: it stops at the next token once one waits, and does not start if one does."""
    warmed = make_engine(4)
    asked = 0

    def waiting() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3  # a job comes in while the slots read their prompts

    try:
        with caplog.at_level("INFO", logger="worker.engine.model"):
            warmed.warm_up(until=waiting)
            assert "cut short: a job is waiting" in caplog.text
            assert warmed.warm_up(until=lambda: True) == 0.0
            assert "no warm-up: a job is waiting" in caplog.text
        assert warmed.counters() == BatchCounters()
        assert [generate(warmed, job(warmed, q, i)) for i, q in enumerate(QUESTIONS)] == alone
    finally:
        warmed.close()


def test_a_worker_is_listed_only_once_warm(tmp_path):
    import httpx

    from devstack.processes import start_api, start_redis, start_worker

    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(tmp_path, url)
    worker = None
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            worker = start_worker(tmp_path, url)
            deadline = time.monotonic() + 120
            # From the worker's start on: the first answer that counts it, as an autoscaler
            # or a client would see it; its log must say it was warm by then.
            while True:
                assert time.monotonic() < deadline and worker.alive(), worker.log()
                scaling = client.get(f"/scaling/{DEFAULT_MODEL_NAME}")
                if scaling.status_code == 200 and scaling.json()["workers"]:
                    log = worker.log()
                    break
                time.sleep(0.01)
            assert scaling.json()["slots"] >= 1
            assert "warm in" in log, log
            models = client.get("/v1/models").json()["data"]
            assert [m["workers"] for m in models if m["id"] == DEFAULT_MODEL_NAME] == [1]
    finally:
        for p in (worker, api, redis_proc):
            if p is not None:
                p.stop()
