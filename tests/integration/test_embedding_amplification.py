"""Embeddings as an attacker would send them (issue 74, finding 2), to a real stack: valkey with
a small `maxmemory`, the API with keys, and an embedding worker of a wide model (4,096
dimensions, one layer: the vectors of a large model, embedded fast). Vectors are not kept
in Redis past their answer, whatever the Idempotency-Key; one request's tokens are bounded
before anything is enqueued; and a large float answer is written in pieces, so another
key's answer does not wait for it."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from gguf import PoolingType

from contract import keys
from devstack import random_model
from devstack.peek import job_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model

pytestmark = pytest.mark.integration

MODEL = "wide-embedder"
DIMENSIONS = random_model.SHAPES["wide"].hidden
HOLDER = "sk-holder"  # 2 MB a minute
OTHER = "sk-other"
TOKENS_PER_REQUEST = 4096
MEMORY_HIGH = 0.11  # of 512 MB: 56 MB, less than five 512-input answers kept (5 x 11 MB)


@dataclass
class Stack:
    base: str
    r: redis.Redis
    worker: Proc
    url: str
    logs: Path
    env: dict[str, str]  # the API's

    def client(self, key: str, base: str = "") -> httpx.Client:
        auth = {"Authorization": f"Bearer {key}"}
        return httpx.Client(base_url=base or self.base, headers=auth, timeout=300)

    def used(self) -> int:
        return int(self.r.info("memory")["used_memory"])

    def held_since(self, used: int, bound: int) -> int:
        """What Redis holds more than `used` once it has let go of what passes through it (a
        connection's buffer of the last large command is trimmed within seconds), or more than
        `bound` for 10 s: what is kept."""
        deadline = time.monotonic() + 10
        while (held := self.used() - used) > bound and time.monotonic() < deadline:
            time.sleep(0.2)
        return held

    def waiting(self) -> int:
        return sum(self.r.llen(k) for k in keys.queue_keys(f"{MODEL}#embed"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("embedding-amplification")
    model = logs / f"{MODEL}.gguf"
    random_model.write("wide", model, kind="q4_0", pooling=PoolingType.MEAN)
    key_file = logs / "keys"
    key_file.write_text(f"{HOLDER} bytes_per_minute=2000000\n{OTHER}\n")
    redis_proc, url = start_redis(logs, extra=("--maxmemory", "512mb", "--maxmemory-policy", "noeviction"))
    worker = start_worker(logs, url, name="e1", env={"MODEL_PATH": str(model), "SLOTS": "8", "N_CTX": "512"})
    env = {
        "API_KEYS_FILE": str(key_file),
        "REDIS_MEMORY_HIGH": str(MEMORY_HIGH),
        "MAX_EMBEDDING_TOKENS": str(TOKENS_PER_REQUEST),
        "KEEPALIVE_SECONDS": "0.5",
        "BATCH_INTERVAL_SECONDS": "0.1",
    }
    api, base = start_api(logs, url, env=env)
    try:
        auth = {"Authorization": f"Bearer {OTHER}"}
        wait_for_model(base, MODEL, procs=(worker, api), headers=auth, embeddings=True)
        yield Stack(base, redis.Redis.from_url(url), worker, url, logs, env)
    finally:
        for p in (api, worker, redis_proc):
            p.stop()


def token_inputs(n: int, first: int = 1) -> list[list[int]]:
    """`n` inputs of one token id each: the most vectors for the fewest bytes sent."""
    return [[first + i % 1000] for i in range(n)]


def vectors(answer: httpx.Response) -> np.ndarray:
    """The base64 vectors of an answer, one row each."""
    data = answer.json()["data"]
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])


def test_idempotent_requests_leave_no_vectors_behind_to_fill_redis(stack):
    """Five 3.5 KB requests of 512 inputs would each keep 11 MB of vectors for an hour: the
    key's 2 MB a minute would hold 56 MB, and every key would get `storage_full`."""
    used = stack.used()
    body = {"model": MODEL, "input": token_inputs(512), "encoding_format": "base64"}
    with stack.client(HOLDER) as holder, stack.client(OTHER) as other:
        answers = []
        for n in range(5):
            answer = holder.post("/v1/embeddings", json=body, headers={"Idempotency-Key": f"fill-{n}"})
            assert answer.status_code == 200, answer.text
            answers.append(vectors(answer))
        held = stack.held_since(used, 2_000_000)
        assert held <= 2_000_000, f"{held} bytes left in Redis"
        time.sleep(1.5)  # the API reads Redis's memory once a second
        small = other.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2, 3]]})
        assert small.status_code == 200, small.text  # not 503 storage_full
        # a retry with a key whose answer was sent embeds again: the same vectors, not an error
        again = holder.post("/v1/embeddings", json=body, headers={"Idempotency-Key": "fill-0"})
        assert again.status_code == 200, again.text
        assert np.all(np.sum(vectors(again) * answers[0], axis=1) > 0.999)
    assert stack.held_since(used, 2_000_000) <= 2_000_000


def test_a_batch_s_embedding_lines_leave_their_vectors_only_in_its_results(stack):
    """A line's answer is charged to the key as the batch's results (FILES_BYTES_PER_KEY); its
    job, holding the same vectors again, goes once the answer is recorded."""
    lines = [
        {
            "custom_id": f"e-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": token_inputs(64, first=100 * i), "encoding_format": "base64"},
        }
        for i in range(2)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with stack.client(OTHER) as c:
        file_id = c.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
        ).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        batch = c.post("/v1/batches", json=body).raise_for_status().json()
        deadline = time.monotonic() + 120
        while (batch := c.get(f"/v1/batches/{batch['id']}").json())["status"] != "completed":
            assert time.monotonic() < deadline and batch["status"] in (
                "validating",
                "in_progress",
                "finalizing",
            )
            time.sleep(0.2)
        out = [
            json.loads(row) for row in c.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
        ]
    assert [len(row["response"]["body"]["data"]) for row in out] == [64, 64]
    left = [
        row["response"]["request_id"]
        for row in out
        if stack.r.exists(keys.job(row["response"]["request_id"]))
    ]
    assert not left, f"the jobs of {len(left)} answered lines kept their vectors"


@pytest.mark.parametrize(
    "inputs",
    [
        ["x" * 1000] * 5,  # strings: one token per UTF-8 byte at most
        ["é" * 500] * 5,  # two bytes a character
        [list(range(1, 1001))] * 5,  # token arrays: exactly
    ],
    ids=["ascii", "utf-8", "token-arrays"],
)
def test_a_request_over_the_tokens_per_request_is_a_400_before_anything_is_enqueued(stack, inputs):
    before = len(job_ids(stack.r))
    with stack.client(OTHER) as c:
        answer = c.post("/v1/embeddings", json={"model": MODEL, "input": inputs})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "input" and str(TOKENS_PER_REQUEST) in error["message"]
    assert len(job_ids(stack.r)) == before and stack.waiting() == 0


def wait_for_an_ended_job(stack: Stack, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(stack.r.hget(keys.job(j), keys.JobField.ENDED) == b"1" for j in job_ids(stack.r)):
        assert time.monotonic() < deadline, "the large request never ended"
        time.sleep(0.01)


def small_answer_s(stack: Stack, base: str) -> float:
    """Another key's request of two vectors: past the size of an answer built off the event
    loop (16 KiB), far from a large one."""
    with stack.client(OTHER, base) as c:
        started = time.monotonic()
        answer = c.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2], [3]]})
        took = time.monotonic() - started
    assert answer.status_code == 200 and len(answer.json()["data"]) == 2, answer.text
    return took


@pytest.fixture
def roomy(stack) -> Iterator[str]:
    """Another API on the stack whose new work Redis's memory does not refuse: 2,048 vectors
    of 4,096 floats are 44 MB in Redis, three times that while they are written."""
    api, base = start_api(
        stack.logs, stack.url, name="api-roomy", env={**stack.env, "REDIS_MEMORY_HIGH": "1"}
    )
    try:
        wait_for_model(
            base, MODEL, procs=(api,), headers={"Authorization": f"Bearer {OTHER}"}, embeddings=True
        )
        yield base
    finally:
        api.stop()


def test_a_large_float_answer_does_not_hold_up_another_keys_answer(stack, roomy):
    """2,048 vectors of 4,096 floats are 160 MB of JSON: built whole, they took for seconds
    the one lane that builds every large answer and parses every large body. Written in
    pieces, they hold nobody up."""
    alone = max(small_answer_s(stack, roomy) for _ in range(3))
    got: dict[str, object] = {}

    def large() -> None:
        body = {"model": MODEL, "input": token_inputs(2048, first=7), "encoding_format": "float"}
        with stack.client(HOLDER, roomy) as c, c.stream("POST", "/v1/embeddings", json=body) as answer:
            got["status"] = answer.status_code
            size, head, tail = 0, b"", b""
            for piece in answer.iter_bytes():
                head = head or piece[:64]
                tail = (tail + piece)[-200:]
                size += len(piece)
            got.update(size=size, head=head, tail=tail, done=time.monotonic())

    thread = threading.Thread(target=large, daemon=True)
    thread.start()
    wait_for_an_ended_job(stack)
    ended = time.monotonic()
    time.sleep(1.0)  # its vectors read, its answer is being built or written (6 s of CPU whole)
    took = small_answer_s(stack, roomy)
    thread.join(timeout=300)
    answering = float(got["done"]) - ended  # type: ignore[arg-type]
    print(
        f"another key's answer: {took:.2f} s ({alone:.2f} s alone) beside one answered in {answering:.2f} s"
    )
    assert got["status"] == 200 and got["size"] > 2048 * DIMENSIONS * 8, got.get("size")
    assert bytes(got["head"]).startswith(b'{"object":"list","data":[{"object":"embedding","index":0,')
    assert b'"usage":{"prompt_tokens":2048,"total_tokens":2048}}' in bytes(got["tail"])
    # Built whole, the large answer held the lane for seconds (6 s of CPU, 15 s on a loaded
    # machine): asked a second in, the other answer waited about `answering` - 1 s. Written,
    # it holds nobody: the other waits for a share of the machine, however loaded (2.09 s
    # beside a 5.2 s answer in a CI run with two lanes). Half the answer, at most 3 s, tells
    # the two apart on any machine where the large answer takes over 2 s.
    assert took <= alone + min(3.0, answering / 2), f"another key's answer took {took:.2f} s beside it"
