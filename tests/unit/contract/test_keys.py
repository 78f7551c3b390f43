"""contract/keys.py: the Redis key names both sides share, kept across releases, and the hash-tag rule
that keeps a job's keys and its shard's indexes in one cluster slot."""

from __future__ import annotations

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from rq.job import JOB_ID_PATTERN

from contract import keys, tiers
from contract.keys import BatchPart, JobStatus, OwnerIndex

JOB = "chatcmpl-abc"


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_a_job_s_keys_are_wire_names_that_never_change():
    """A release that renamed them would orphan every unfinished job of the one before."""
    assert keys.shard(JOB) == 30
    assert keys.job(JOB) == "ts:{30-31}:job:chatcmpl-abc"
    assert keys.events(JOB) == "ts:{30-31}:events:chatcmpl-abc"
    assert keys.alive(JOB) == "ts:{30-31}:alive:chatcmpl-abc"
    assert keys.running(30) == "ts:{30-31}:running" and keys.pending(30) == "ts:{30-31}:pending"
    assert keys.shard("resp_1") == 23 and keys.job("resp_1") == "ts:{23-20}:job:resp_1"
    assert keys.JOB_FUNCTION == "worker.runner.generate"


def test_each_shard_s_tag_is_the_first_whose_slot_lies_in_the_shard_s_share():
    share = REDIS_CLUSTER_HASH_SLOTS // keys.SHARDS
    assert len(set(keys.TAGS)) == keys.SHARDS == 32
    for i, tag in enumerate(keys.TAGS):
        prefix, n = tag.split("-")
        assert prefix == str(i)
        assert key_slot(tag.encode()) // share == i
        assert all(key_slot(f"{i}-{m}".encode()) // share != i for m in range(int(n)))


@pytest.mark.parametrize("job_id", ["chatcmpl-abc", "resp_1", "chatcmpl-test", "batch_req_9", "x"])
def test_a_job_s_keys_and_its_shard_s_indexes_share_one_cluster_slot(job_id):
    shard = keys.shard(job_id)
    together = [
        keys.job(job_id),
        keys.events(job_id),
        keys.alive(job_id),
        keys.running(shard),
        keys.pending(shard),
        keys.hub_control("api-1", shard),
        keys.ack_mark_beside(keys.job(job_id)),
    ]
    assert {slot(k) for k in together} == {slot(keys.job(job_id))}
    assert slot(keys.job(job_id)) // (REDIS_CLUSTER_HASH_SLOTS // keys.SHARDS) == shard


def test_the_shard_of_a_key_is_read_back_from_its_tag():
    for shard in (0, 7, 31):
        assert keys.shard_of_key(keys.running(shard)) == shard
        assert keys.shard_of_key(keys.pending(shard)) == shard
        assert keys.shard_of_key(keys.hub_control("api-1", shard)) == shard
    assert keys.shard_of_key(keys.events(JOB)) == 30
    with pytest.raises(ValueError):  # a queues-server key names no shard
        keys.shard_of_key(keys.wake("m"))


def test_the_ack_mark_beside_a_key_without_a_tag_is_the_server_s_own():
    assert keys.ack_mark_beside(keys.wake("m")) == keys.ACK_MARK == "ts:acks"
    assert keys.ack_mark_beside("ts:{3-22}:hub:p") == "ts:{3-22}:acks"


def test_a_continuation_s_rq_id_is_a_valid_rq_id_that_leads_back_to_its_job():
    assert keys.rq_job_id(JOB, 0) == JOB
    assert keys.rq_job_id(JOB, 3) == "chatcmpl-abc__a3"
    for epoch in (0, 1, 12):
        rq_id = keys.rq_job_id(JOB, epoch)
        assert JOB_ID_PATTERN.fullmatch(rq_id)
        assert keys.job_of(rq_id) == JOB
    assert keys.rq_job("chatcmpl-abc__a3") == "rq:job:chatcmpl-abc__a3"
    assert keys.callback("chatcmpl-abc__a3") == "ts:callback:chatcmpl-abc__a3"


def test_a_model_s_queue_keys_are_rq_s_in_taking_order_and_the_interactive_ones_leave_out_batch():
    assert keys.queue_key("m") == "rq:queue:m"
    assert keys.queue_keys("m") == [
        "rq:queue:m#suspect",
        "rq:queue:m#priority",
        "rq:queue:m",
        "rq:queue:m#flex",
        "rq:queue:m#batch",
    ]
    assert keys.interactive_queue_keys("m") == keys.queue_keys("m")[:-1]
    assert keys.rq_queue_key(tiers.queue_name("m", tiers.BATCH)) not in keys.interactive_queue_keys("m")
    assert keys.rq_queue_workers_key("m@w1") == "rq:workers:m@w1"


def test_owner_and_batch_keys_are_named_by_their_enums():
    assert keys.owned("o1", OwnerIndex.JOBS) == "ts:owner:o1:jobs"
    assert keys.owned("o1", OwnerIndex.RESERVED_TOKENS) == "ts:owner:o1:reservedtokens"
    assert keys.owned("o1", OwnerIndex.RUNNING_BATCHES) == "ts:owner:o1:running"
    assert keys.batch("b1") == "ts:batch:b1"  # its state: no suffix
    assert keys.batch("b1", BatchPart.LINES) == "ts:batch:b1:lines"
    assert keys.batch("b1", BatchPart.RESULTS) == "ts:batch:b1:results"
    index_keys = {keys.owned("o1", index) for index in OwnerIndex}
    assert len(index_keys) == len(OwnerIndex)  # no two indexes share a key


def test_per_minute_budgets_are_one_key_per_owner_and_minute():
    assert keys.requests_per_minute("o1", 29_000_000) == "ts:rate:o1:29000000"
    assert keys.bytes_per_minute("o1", 5) == "ts:bytes:o1:5"
    assert keys.tokens_per_minute("o1", 5) == "ts:tokens:o1:5"
    assert keys.idempotency("o1", "d" * 64) == "ts:idem:o1:" + "d" * 64


def test_job_statuses_are_the_lifecycle_s_and_only_the_three_ends_are_ended():
    assert (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED) == (
        "queued",
        "running",
        "done",
        "failed",
        "cancelled",
    )
    assert set(JobStatus.ENDED) == {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}
