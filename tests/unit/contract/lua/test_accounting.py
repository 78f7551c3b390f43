"""contract/lua/accounting.py on fakeredis with real Lua: what a key holds is charged with the write
that makes it, in a few commands whatever the key holds, and given back."""

from __future__ import annotations

import time

import fakeredis
import pytest

from contract import keys
from contract.lua import accounting

OWNER = "o"
H = accounting.charge_keys(OWNER)


@pytest.fixture
def r():
    return fakeredis.FakeRedis()


def store(r, file_id: str, size: int, budget: int = 0, files: int = 0, expires: int | None = None) -> list:
    expires = expires or int(time.time()) + 3600
    return r.register_script(accounting.STORE_FILE)(
        keys=[keys.file(file_id), keys.file_content(file_id), *H],
        args=[file_id, size, expires, int(time.time()), budget, files, "1", "owner", OWNER, b"x" * size],
    )


def held(r) -> int:
    return int(r.get(keys.owned(OWNER, keys.OwnerIndex.FILE_HELD)) or 0)


def test_a_file_is_stored_and_charged_within_the_budget_and_refused_beyond_it(r):
    assert store(r, "file-a", 60, budget=100) == [b"new"]
    assert r.get(keys.file_content("file-a")) == b"x" * 60 and held(r) == 60
    assert store(r, "file-b", 50, budget=100) == [b"quota", 60]
    assert not r.exists(keys.file("file-b"), keys.file_content("file-b"))
    assert store(r, "file-c", 40, budget=100) == [b"new"] and held(r) == 100


def test_the_number_of_files_is_bounded_too(r):
    for i in range(3):
        assert store(r, f"file-{i}", 1, files=3) == [b"new"]
    assert store(r, "file-3", 1, files=3) == [b"files", 3]


def test_expired_charges_are_given_back_a_hundred_at_a_time_with_later_charges(r):
    past = int(time.time()) - 10
    for i in range(150):  # as STORE_FILE leaves them, expired since
        r.hset(H[0], f"file-{i}", f"10 {past}")
        r.zadd(H[1], {f"file-{i}": past})
        r.zadd(H[3], {f"file-{i}": past})
    r.set(H[2], 1500)
    store(r, "file-new", 10)  # drops a hundred of the expired ones, whatever the owner holds
    assert held(r) == 510
    store(r, "file-new2", 10)
    assert held(r) == 20
    assert r.zcard(keys.owned(OWNER, keys.OwnerIndex.FILES)) == 2


def test_sizes_written_before_the_sum_was_kept_are_summed_once(r):
    later = int(time.time()) + 3600
    r.hset(keys.owned(OWNER, keys.OwnerIndex.FILE_SIZES), mapping={"file-old": f"70 {later}"})
    assert store(r, "file-a", 40, budget=100) == [b"quota", 70]
    assert held(r) == 70


def test_deleting_a_file_gives_its_bytes_back(r):
    store(r, "file-a", 60)
    r.register_script(accounting.DELETE_FILE)(
        keys=[keys.file("file-a"), keys.file_content("file-a"), *H], args=["file-a"]
    )
    assert held(r) == 0 and not r.exists(keys.file("file-a"), keys.file_content("file-a"))


def test_an_output_file_appended_in_pieces_is_charged_whatever_the_owner_holds(r):
    store(r, "file-a", 90, budget=100)
    r.append(keys.file_content("file-o"), b"y" * 30)
    verdict = r.register_script(accounting.STORE_FILE)(
        keys=[keys.file("file-o"), keys.file_content("file-o"), *H],
        args=["file-o", 30, int(time.time()) + 60, int(time.time()), 0, 0, "0", "owner", OWNER],
    )
    assert verdict == [b"new"] and held(r) == 120 and r.get(keys.file_content("file-o")) == b"y" * 30


def batch(r, batch_id: str, lines: list[str], budget: int = 0, running: int = 0) -> list:
    return r.register_script(accounting.CREATE_BATCH)(
        keys=[
            keys.batch(batch_id),
            keys.batch(batch_id, keys.BatchPart.LINES),
            keys.owned(OWNER, keys.OwnerIndex.BATCHES),
            keys.ACTIVE_BATCHES,
            keys.owned(OWNER, keys.OwnerIndex.RUNNING_BATCHES),
            *H,
        ],
        args=[
            batch_id,
            int(time.time() * 1000),
            running,
            10**9,
            budget,
            accounting.lines_charge(batch_id),
            sum(len(x) for x in lines),
            int(time.time()) + 3600,
            len(lines),
            *lines,
            "owner",
            OWNER,
        ],
    )


def test_a_batch_s_copy_of_its_lines_is_charged_and_refused_beyond_the_budget(r):
    assert batch(r, "batch_a", ["a" * 40, "b" * 40], budget=100) == [b"new"]
    assert held(r) == 80 and r.llen(keys.batch("batch_a", keys.BatchPart.LINES)) == 2
    assert batch(r, "batch_b", ["c" * 30], budget=100) == [b"quota", 80]
    assert not r.exists(keys.batch("batch_b"))
    assert batch(r, "batch_c", ["c"], running=1) == [b"batches", 1]


def test_answers_are_charged_once_and_released_with_the_lines(r):
    batch(r, "batch_a", ["a" * 40])
    answer = r.register_script(accounting.ANSWER)
    parts = [keys.batch("batch_a", p) for p in (keys.BatchPart.RESULTS, keys.BatchPart.OPEN)]
    args = [0, "z" * 25, "completed", 3, 4, accounting.results_charge("batch_a"), int(time.time()) + 60]
    for _ in range(2):  # a driver that died after the first answers nothing twice
        answer(keys=[*parts, keys.batch("batch_a"), *H], args=args)
    assert held(r) == 65 and r.hget(keys.batch("batch_a"), "completed") == b"1"
    left = r.register_script(accounting.RELEASE)(
        keys=H, args=[accounting.lines_charge("batch_a"), accounting.results_charge("batch_a")]
    )
    assert left == 0 and held(r) == 0


def test_a_status_changes_only_from_the_statuses_named(r):
    set_status = r.register_script(accounting.SET_STATUS)
    r.hset(keys.batch("batch_a"), mapping={"status": "completed"})
    assert set_status(
        keys=[keys.batch("batch_a")], args=["validating in_progress", "status", "cancelling"]
    ) == (b"completed")
    r.hset(keys.batch("batch_a"), "status", "in_progress")
    assert (
        set_status(keys=[keys.batch("batch_a")], args=["validating in_progress", "status", "cancelling"]) == 1
    )
    assert r.hget(keys.batch("batch_a"), "status") == b"cancelling"
    assert set_status(keys=[keys.batch("batch_missing")], args=["in_progress", "status", "x"]) == 0


def test_a_batch_begins_to_end_only_with_no_line_open_and_every_line_sent_if_it_completes(r):
    finalize = r.register_script(accounting.FINALIZE)
    batch, open_lines = keys.batch("batch_a"), keys.batch("batch_a", keys.BatchPart.OPEN)
    r.hset(batch, mapping={"status": "in_progress", "total": 3, "next": 2})
    r.hset(open_lines, "1", "chatcmpl-x")
    ending = ["status", "finalizing"]
    assert finalize(keys=[batch, open_lines], args=["in_progress", 1, *ending]) == b"open"
    r.delete(open_lines)
    assert finalize(keys=[batch, open_lines], args=["in_progress", 1, *ending]) == b"unsent"
    assert finalize(keys=[batch, open_lines], args=["cancelling", 0, *ending]) == b"in_progress"
    assert finalize(keys=[batch, open_lines], args=["in_progress", 0, *ending]) == 1  # expired: unsent ok
    assert r.hget(batch, "status") == b"finalizing"


def test_spend_counts_requests_and_bytes_per_minute(r):
    spend = r.register_script(accounting.SPEND)
    k = ["rate", "bytes"]
    assert spend(keys=k, args=[2, 100, 60]) == [b"ok"]
    assert spend(keys=k, args=[2, 100, 50]) == [b"rate", b"bytes"]
    assert spend(keys=k, args=[2, 100, 40]) == [b"ok"]
    assert spend(keys=k, args=[2, 100, 0]) == [b"rate", b"requests"]


def admit(
    r, job_id: str, tokens: int, prompt: int = 0, max_tokens: int = 1000, minute: int = 7, rpm: int = 0
) -> list:
    """ADMIT for OWNER with only a request and a token budget."""
    unfinished = keys.owned(OWNER, keys.OwnerIndex.JOBS)
    return r.register_script(accounting.ADMIT)(
        keys=[
            unfinished,
            unfinished,
            keys.requests_per_minute(OWNER, minute),
            keys.bytes_per_minute(OWNER, minute),
            keys.tokens_per_minute(OWNER, minute),
            keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS),
        ],
        args=[job_id, "", 3600, 0, rpm, 0, 10, "0", max_tokens, tokens, prompt, minute],
    )


def settle(r, job_id: str, used: str, minute: int = 7) -> int:
    return r.register_script(accounting.SETTLE)(
        keys=[keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), keys.tokens_per_minute(OWNER, minute)],
        args=[job_id, minute, used],
    )


def tokens(r, minute: int = 7) -> int:
    return int(r.get(keys.tokens_per_minute(OWNER, minute)) or 0)


def test_a_job_reserves_its_tokens_and_one_that_would_go_over_the_minute_s_budget_is_refused(r):
    assert admit(r, "a", 600, prompt=100, rpm=10) == [b"new", 1, 600]
    assert admit(r, "b", 401, rpm=10) == [b"rate", b"tokens", 1, 600]  # nothing counted
    assert r.get(keys.requests_per_minute(OWNER, 7)) == b"1"
    assert admit(r, "c", 400, rpm=10) == [b"new", 2, 1000]
    assert r.hget(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), "a") == b"7 600 100"


def test_settling_charges_the_usage_once_in_place_of_the_reservation(r):
    admit(r, "a", 600, prompt=100)
    assert settle(r, "a", "250") == 250 and tokens(r) == 250
    assert settle(r, "a", "250") == -1 and tokens(r) == 250  # a second reader of the end: nothing
    admit(r, "b", 300, prompt=40)
    assert settle(r, "b", "") == 40 and tokens(r) == 290  # failed: its prompt's bound
    admit(r, "c", 300, prompt=40)
    assert settle(r, "c", "-") == 300 and tokens(r) == 590  # gone: the whole reservation
    admit(r, "d", 100, prompt=10)
    assert settle(r, "d", "400") == 400 and tokens(r) == 990  # it used more than it reserved


def test_a_reservation_of_an_earlier_minute_gives_nothing_back_to_this_minute(r):
    admit(r, "a", 600, prompt=100, minute=7)
    admit(r, "b", 500, prompt=100, minute=8)
    assert settle(r, "a", "10", minute=8) == 10
    assert tokens(r, minute=8) == 500 and tokens(r, minute=7) == 600
    assert not r.hexists(keys.owned(OWNER, keys.OwnerIndex.RESERVED_TOKENS), "a")


def test_what_a_job_used_beyond_an_earlier_minute_s_reservation_is_charged_to_this_minute(r):
    admit(r, "a", 100, prompt=50, minute=7)
    admit(r, "b", 200, prompt=50, minute=7)
    assert settle(r, "a", "400", minute=8) == 400
    assert tokens(r, minute=8) == 300 and tokens(r, minute=7) == 300  # its excess, in the minute it ended
    assert 0 < r.ttl(keys.tokens_per_minute(OWNER, 8)) <= 120
    assert settle(r, "b", "-", minute=9) == 200 and tokens(r, minute=9) == 0  # gone: nothing beyond


def test_a_job_reserving_nothing_is_not_held(r):
    assert admit(r, "count", 0) == [b"new", 0, 0]
    assert settle(r, "count", "30") == -1 and tokens(r) == 0
