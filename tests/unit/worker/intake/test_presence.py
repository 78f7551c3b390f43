import time

import fakeredis
import pytest
import redis

from contract import keys, tiers
from contract.stats import BatchCounters, StatField
from worker.intake.presence import Presence, Starting

MODEL = "m"


def test_an_announcement_carries_the_slots_and_what_the_scheduler_did_since_the_last():
    r = fakeredis.FakeRedis()
    live = BatchCounters()
    p = Presence(r, MODEL, "w1", 60, slots=8, counters=lambda: live)
    live.steps, live.sequences, live.prefill_tokens = 10, 35, 120
    p.announce()
    assert r.zscore(keys.workers(MODEL), "w1") is not None
    assert r.hget(keys.worker_slots(MODEL), "w1") == b"8"
    stat = lambda name: int(r.hget(keys.STATS, StatField.batch(name, MODEL)) or 0)  # noqa: E731
    assert (stat("steps"), stat("sequences"), stat("prefill_tokens"), stat("moves")) == (10, 35, 120, 0)
    live.steps, live.sequences, live.moves = 14, 43, 1
    p.announce()  # adds only what changed: two workers' counters sum
    assert (stat("steps"), stat("sequences"), stat("prefill_tokens"), stat("moves")) == (14, 43, 120, 1)
    p.announce()
    assert stat("steps") == 14


def test_a_failed_announcement_is_added_by_the_next_one():
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    live = BatchCounters(steps=5)
    p = Presence(r, MODEL, "w1", 60, counters=lambda: live)
    server.connected = False
    with pytest.raises(redis.ConnectionError):
        p.announce()
    server.connected = True
    p.announce()
    assert r.hget(keys.STATS, StatField.batch("steps", MODEL)) == b"5"


def test_stopping_says_goodbye_with_the_last_counts():
    r = fakeredis.FakeRedis()
    live = BatchCounters()
    p = Presence(r, MODEL, "w1", 60, slots=4, counters=lambda: live)
    p.start()
    live.steps = 3
    p.stop()
    assert r.zscore(keys.workers(MODEL), "w1") is None
    assert r.hget(keys.worker_slots(MODEL), "w1") is None
    assert r.hget(keys.STATS, StatField.batch("steps", MODEL)) == b"3"


def test_an_announcement_says_where_the_model_and_its_cache_are():
    from worker.engine.protocol import Placement

    r = fakeredis.FakeRedis()
    gpu = Placement("CUDA", "NVIDIA H100 80GB HBM3", (70 << 30, 80 << 30), 32, 32, 8 << 30, 32, 4096)
    p = Presence(r, MODEL, "w1", 60, placement=gpu)
    p.announce()
    assert r.hget(keys.worker_placement(MODEL), "w1") == f"32 {8 << 30}".encode()
    said = gpu.describe()
    assert "backend CUDA on NVIDIA H100 80GB HBM3 (80.0 GiB, 70.0 GiB free)" in said
    assert "32 of 32 layers offloaded" in said and "8.00 GiB on the GPU, 0.00 GiB in host memory" in said
    assert said.endswith("32 slots x 4096 tokens")
    p.start()
    p.stop()  # a worker that stops takes its announcement with it
    assert not r.hexists(keys.worker_placement(MODEL), "w1")


def test_held_prefixes_are_written_when_they_change_rewritten_when_gone_and_withdrawn_at_leaving():
    from worker.engine.held import HeldPrefixes

    r = fakeredis.FakeRedis()
    held = HeldPrefixes(2)
    p = Presence(r, MODEL, "w1", 60, held=held, held_ttl_s=15)
    job = object()
    held.taken(0, job)
    held.held(job, ["a", "b"])
    p.announce()
    key = keys.held_prefixes("w1")
    assert r.smembers(key) == {b"a", b"b"} and 0 < r.pttl(key) <= 15_000
    r.delete(key)  # the reaper thought the worker dead, or the set expired through an outage
    p.announce()  # nothing changed here: kept alive only, and found gone
    p.announce()
    assert r.smembers(key) == {b"a", b"b"}
    p.withdraw()
    p.announce()
    held.held(job, ["c"])  # a job ending while the worker leaves claims nothing
    p.announce()
    assert r.smembers(key) == set()


def test_a_job_s_held_prefixes_are_written_before_its_thread_goes_on():
    """A conversation's next turn comes the moment its answer ends: the job's thread writes
    the set before its terminal entry is published, not the presence thread some time after."""
    from worker.engine.held import HeldPrefixes

    r = fakeredis.FakeRedis()
    held = HeldPrefixes(2)
    p = Presence(r, MODEL, "w1", 60, held=held)
    held.changed = p.held_changed
    p.announce()
    job = object()
    held.taken(1, job)
    held.held(job, ["a", "b"])  # no announcement in between
    assert r.smembers(keys.held_prefixes("w1")) == {b"a", b"b"}
    assert 0 < r.pttl(keys.held_prefixes("w1")) <= 15_000


def test_a_job_past_its_end_leaves_its_slot_free_for_routing():
    """The router sends no job to a worker whose slots are all in use while another has one
    free. A job that ended still counted as running until its thread was gone, so the
    worker said it was full for up to an announcement's period: a conversation's next turn,
    sent the moment its answer ended, went to the other worker and read its prompt again
    (issue 76: the first two follow-ups of nine)."""
    import threading

    from worker.engine.held import HeldPrefixes

    r = fakeredis.FakeRedis()
    held = HeldPrefixes(1)
    running: set[threading.Thread] = set()
    p = Presence(r, MODEL, "w1", 60, slots=1, held=held, load=lambda: (len(running), 0.0))
    held.changed = p.held_changed
    in_use = lambda: int(r.hget(keys.worker_load(MODEL), "w1").split()[0])  # noqa: E731
    job, ended, publish = object(), threading.Event(), threading.Event()

    def thread() -> None:  # as the runner's job thread: its end, then the terminal entry
        held.taken(0, job)
        held.held(job, ["a"])
        ended.set()
        publish.wait(10)

    t = threading.Thread(target=thread)
    running.add(t)
    p.announce()
    assert in_use() == 1
    t.start()
    assert ended.wait(10)
    assert in_use() == 0  # written with its prefixes, before its terminal entry
    p.announce()
    assert in_use() == 0  # and the presence thread says so too while the thread lives on
    publish.set()
    t.join()
    running.discard(t)
    p.announce()
    assert in_use() == 0
    running.add(threading.current_thread())  # a next job: counted as ever
    p.announce()
    assert in_use() == 1


def test_through_an_outage_a_job_s_prefixes_are_left_to_the_presence_thread():
    from worker.engine.held import HeldPrefixes

    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    held = HeldPrefixes(1)
    p = Presence(r, MODEL, "w1", 60, held=held)
    held.changed = p.held_changed
    job = object()
    held.taken(0, job)
    server.connected = False
    held.held(job, ["a"])  # the job's end is not held up or failed by it
    server.connected = True
    assert not r.exists(keys.held_prefixes("w1"))
    p.announce()
    assert r.smembers(keys.held_prefixes("w1")) == {b"a"}


def test_a_starting_worker_says_so_until_it_serves():
    """Jobs requeued while it loads wait for it (api/cluster/resumes.py); once it serves (or
    gives up) it no longer says so."""
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    starting = Starting(fakeredis.FakeRedis(server=server), MODEL, "w1", 0.05)
    r.zadd(keys.starting_workers(MODEL), {"long-gone": 1})  # a start that died a day ago and more
    starting.start()
    deadline = time.monotonic() + 5
    while r.zscore(keys.starting_workers(MODEL), "w1") is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    said = r.zscore(keys.starting_workers(MODEL), "w1")
    assert abs(said - time.time() * 1000) < 5_000
    assert r.zscore(keys.starting_workers(MODEL), "long-gone") is None
    starting.stop()
    assert r.zcard(keys.starting_workers(MODEL)) == 0


def test_a_starting_worker_sees_a_job_waiting_for_its_model():
    """The warm-up stops for a job in the model's queues (batch lines aside), asking Redis
    at most every LOOK_EVERY_S, and warms up as usual while Redis cannot say."""
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    starting = Starting(fakeredis.FakeRedis(server=server), MODEL, "w1", 60)
    starting.LOOK_EVERY_S = 0.0
    assert not starting.jobs_waiting()
    r.rpush(keys.rq_queue_key(tiers.queue_name(MODEL, tiers.BATCH)), "line")
    r.rpush(keys.rq_queue_key(tiers.queue_name("other")), "job")
    assert not starting.jobs_waiting()  # a batch line, another model's job
    r.rpush(keys.rq_queue_key(tiers.queue_name(MODEL, "priority")), "requeued")
    assert starting.jobs_waiting()
    server.connected = False
    assert not starting.jobs_waiting()
