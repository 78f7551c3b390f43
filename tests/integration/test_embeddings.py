"""`/v1/embeddings` through real processes: the default model served for chat by one worker
and, with POOLING=mean, for embeddings by two more (its embedding pool), driven by the
official SDK (float and base64), LangChain's OpenAIEmbeddings and the Batch API; bad input
refused with nothing enqueued; and an embedding worker SIGKILLed under 32 concurrent
requests, each of which still gets its own vectors."""

from __future__ import annotations

import base64
import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import openai
import pytest
import redis
from gguf import PoolingType

from contract import keys, stats, tiers
from devstack import random_model
from devstack.peek import job_ids, running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.integration.conftest import MODEL, strict_sdk

pytestmark = pytest.mark.integration

POOL = tiers.embedding_pool(MODEL)
EMBED_ENV = {"POOLING": "mean", "N_CTX": "64", "SLOTS": "32", "HEARTBEAT_WINDOW_SECONDS": "2"}
DIMENSIONS = 576  # SmolLM2-135M's hidden size
TEXTS = ["The cat sat on the mat.", "The cat sat on the rug.", "Quarterly revenue grew by four percent."]


@dataclass
class Pool:
    base: str
    url: str
    r: redis.Redis
    logs: object
    workers: dict[str, Proc]

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120)

    def waiting(self) -> int:
        return sum(self.r.llen(k) for k in keys.queue_keys(POOL))

    def start_embedder(self, name: str, env: dict[str, str] | None = None) -> None:
        self.workers[name] = start_worker(self.logs, self.url, name=name, env={**EMBED_ENV, **(env or {})})


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    logs = tmp_path_factory.mktemp("embeddings")
    redis_proc, url = start_redis(logs)
    env = {
        "KEEPALIVE_SECONDS": "0.5",
        "REAPER_INTERVAL_SECONDS": "0.2",
        "MAX_EMBEDDING_INPUTS": "64",
        "MATRYOSHKA_MODELS": MODEL,  # declared so, to test the cut (SmolLM2 was not trained for it)
        "BATCH_INTERVAL_SECONDS": "0.1",
    }
    api, base = start_api(logs, url, env=env)
    p = Pool(
        base,
        url,
        redis.Redis.from_url(url),
        logs,
        {"c1": start_worker(logs, url, name="c1", env={"SLOTS": "1"})},
    )
    p.start_embedder("e1")
    p.start_embedder("e2")
    try:
        wait_for_model(base, MODEL, procs=(api, *p.workers.values()))
        wait_for_model(base, MODEL, procs=(api, *p.workers.values()), embeddings=True)
        yield p
    finally:
        for proc in (*p.workers.values(), api, redis_proc):
            proc.stop()


@pytest.fixture
def sdk(pool) -> Iterator[openai.OpenAI]:
    with strict_sdk(pool.base) as c:
        yield c


def wait_for_a_job_on(pool: Pool, worker: bytes) -> None:
    """Until one of the running attempts is the worker's."""
    deadline = time.monotonic() + 60
    while not any(pool.r.hget(keys.job(j), keys.JobField.WORKER) == worker for j in running_ids(pool.r)):
        assert time.monotonic() < deadline, f"no job reached {worker.decode()}"
        time.sleep(0.02)


def wait_for_workers(pool: Pool, n: int, *procs: Proc) -> None:
    """Until the embedding pool has `n` live workers."""
    deadline = time.monotonic() + 120
    with pool.http() as http:
        while {m["id"]: m for m in http.get("/v1/models").json()["data"]}[MODEL].get(
            "embedding_workers"
        ) != n:
            assert time.monotonic() < deadline and all(p.alive() for p in procs), f"not {n} embedding workers"
            time.sleep(0.2)


def requeued_after_crashes(pool: Pool) -> int:
    """Attempts the reaper took from dead workers, so far (the jobs go once answered)."""
    return int(pool.r.hget(keys.STATS, stats.StatField.requeued("crash")) or 0)


def embed(sdk: openai.OpenAI, inputs, **kw):
    """Floats, named: the strict SDK cannot validate its own default (base64, decoded after)."""
    return sdk.embeddings.create(model=MODEL, input=inputs, encoding_format="float", **kw)


def vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_float_and_base64_give_the_same_unit_vectors_in_input_order(pool, sdk):
    floats = embed(sdk, TEXTS, user="u-1")
    assert floats.model == MODEL and [d.index for d in floats.data] == [0, 1, 2]
    got = vectors(floats)
    assert got.shape == (3, DIMENSIONS) and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 3 * 5
    raw = sdk.embeddings.with_raw_response.create(model=MODEL, input=TEXTS, encoding_format="base64")
    encoded = [d["embedding"] for d in json.loads(raw.text)["data"]]
    decoded = np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in encoded])
    assert np.allclose(decoded, got, atol=1e-6)  # the same inputs, the same vectors
    # the SDK asks for base64 itself when the caller names no encoding, and decodes it
    with openai.OpenAI(base_url=pool.base + "/v1", api_key="unused", max_retries=0) as plain:
        default = plain.embeddings.create(model=MODEL, input=TEXTS[0])
    assert np.allclose(vectors(default), got[:1], atol=1e-6)


def test_a_near_duplicate_is_closer_than_an_unrelated_text(sdk):
    cat, rug, revenue = vectors(embed(sdk, TEXTS))
    assert float(cat @ rug) > float(cat @ revenue) + 0.1


def test_token_arrays_are_embedded_as_given_and_counted_exactly(sdk):
    both = embed(sdk, [[1, 2, 3, 4], [5, 6, 7]])
    assert both.usage.prompt_tokens == 7 and len(both.data) == 2
    alone = embed(sdk, [5, 6, 7])
    assert alone.usage.prompt_tokens == 3
    assert float(vectors(both)[1] @ vectors(alone)[0]) > 0.9999  # batched beside another, or alone


def test_langchain_embeds_documents_and_a_query_against_the_base_url(pool):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: its default sends tiktoken ids, which mean nothing to this model
    lc = OpenAIEmbeddings(
        model=MODEL, base_url=pool.base + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    docs = lc.embed_documents(TEXTS)
    query = lc.embed_query(TEXTS[0])
    assert len(docs) == 3 and len(docs[0]) == DIMENSIONS and np.allclose(docs[0], query, atol=1e-5)


def test_a_gguf_that_declares_its_pooling_is_served_as_an_embedding_model(pool, sdk, tmp_path):
    """No POOLING: the file says mean, as an embedding model's does; its name serves
    embeddings only (weights random: the plumbing does not depend on them)."""
    path = tmp_path / "tiny-embedder.gguf"
    random_model.write("tiny", path, pooling=PoolingType.MEAN)
    proc = start_worker(pool.logs, pool.url, name="t1", env={"MODEL_PATH": str(path), "SLOTS": "4"})
    try:
        wait_for_model(pool.base, "tiny-embedder", procs=(proc,), embeddings=True)
        got = sdk.embeddings.create(model="tiny-embedder", input=TEXTS, encoding_format="float")
        with pool.http() as http:
            listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}["tiny-embedder"]
            chat = http.post(
                "/v1/chat/completions",
                json={"model": "tiny-embedder", "messages": [{"role": "user", "content": "Hi"}]},
            )
    finally:
        proc.stop()
    assert vectors(got).shape == (3, random_model.SHAPES["tiny"].hidden)
    assert listed["kinds"] == ["embeddings"] and listed["workers"] == 0
    assert chat.status_code == 404  # its chat pool has no worker


def test_the_pool_counts_its_inputs_and_tokens_under_its_own_name(pool, sdk):
    embed(sdk, TEXTS)
    label = f'model="{POOL}"'
    deadline = time.monotonic() + 30
    with pool.http() as http:
        while True:  # the workers add their counters with each announcement
            lines = http.get("/metrics").text.splitlines()
            counted = {
                ln.split("{")[0]: float(ln.rsplit(" ", 1)[1])
                for ln in lines
                if label in ln
                and ln.startswith(("tokenspool_batch_sequences", "tokenspool_batch_prefill_tokens"))
            }
            if counted.get("tokenspool_batch_sequences_total", 0) >= 3:
                break
            assert time.monotonic() < deadline, counted
            time.sleep(0.5)
    assert counted["tokenspool_batch_prefill_tokens_total"] >= 3 * 5
    assert any(ln.startswith("tokenspool_queue_depth{") and label in ln for ln in lines)


def test_a_keys_token_budget_counts_embedding_tokens(pool):
    """Token arrays are reserved exactly: 60 of a 100-token minute leave 40, and a second
    60 is refused."""
    api, base = start_api(
        pool.logs, pool.url, name="api-keys", env={"API_KEYS": "sk-embed", "KEY_TOKENS_PER_MINUTE": "100"}
    )
    try:
        wait_for_model(
            base, MODEL, procs=(api,), headers={"authorization": "Bearer sk-embed"}, embeddings=True
        )
        with httpx.Client(base_url=base, timeout=120, headers={"authorization": "Bearer sk-embed"}) as http:
            first = http.post("/v1/embeddings", json={"model": MODEL, "input": [list(range(1, 61))]})
            second = http.post("/v1/embeddings", json={"model": MODEL, "input": [list(range(1, 61))]})
    finally:
        api.stop()
    assert first.status_code == 200 and first.json()["usage"]["prompt_tokens"] == 60
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 40
    assert second.status_code == 429 and "tokens" in second.json()["error"]["message"]


def test_one_model_serves_chat_and_embeddings_from_its_own_workers(pool, sdk):
    chat = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
    )
    assert pool.r.hget(keys.job(chat.id), keys.JobField.WORKER) == b"c1"
    with pool.http() as http:
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        scaling = http.get(f"/scaling/{MODEL}", params={"kind": "embeddings"}).json()
        missing = http.post("/v1/embeddings", json={"model": "no-such-model", "input": "x"})
    assert listed[MODEL]["kinds"] == ["chat", "embeddings"]
    assert listed[MODEL]["workers"] == 1 and listed[MODEL]["embedding_workers"] == 2
    assert scaling["model"] == POOL and scaling["workers"] == 2 and scaling["slots"] == 64
    assert missing.status_code == 404 and "embeddings" in missing.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["x"] * 65}, "input"),
        ({"input": "x", "dimensions": 64, "model": "not-declared-matryoshka"}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_bad_input_is_a_400_naming_it_with_nothing_enqueued(pool, body, param):
    before = len(job_ids(pool.r))
    with pool.http() as http:
        resp = http.post("/v1/embeddings", json={"model": MODEL, **body})
    assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(param)
    assert len(job_ids(pool.r)) == before and pool.waiting() == 0


def test_dimensions_cut_a_declared_models_vectors_and_renormalise_them(pool, sdk):
    whole = vectors(embed(sdk, TEXTS))
    cut = vectors(embed(sdk, TEXTS, dimensions=64))
    expected = whole[:, :64] / np.linalg.norm(whole[:, :64], axis=1, keepdims=True)
    assert cut.shape == (3, 64) and np.allclose(cut, expected, atol=1e-4)
    with pool.http() as http:
        over = http.post("/v1/embeddings", json={"model": MODEL, "input": "x", "dimensions": DIMENSIONS + 1})
    assert over.status_code == 400 and over.json()["error"]["param"] == "dimensions"


def test_many_inputs_may_hold_more_than_one_context_together(sdk):
    """The API's bound on characters per context applies to each input, not to their sum:
    32 inputs of 40 characters are more than a 64-token context's 1,024 characters."""
    inputs = [f"Input number {i:03d} of many, each short." for i in range(32)]
    assert sum(map(len, inputs)) > 16 * 64
    assert len(embed(sdk, inputs).data) == 32


def test_an_input_longer_than_the_model_reads_is_a_400_naming_its_index(pool):
    with pool.http() as http:
        resp = http.post("/v1/embeddings", json={"model": MODEL, "input": ["short", "word " * 200]})
    error = resp.json()["error"]
    assert (
        resp.status_code == 400
        and error["param"] == "input[1]"
        and error["code"] == "context_length_exceeded"
    )


def test_a_batch_of_embedding_lines_answers_each_in_its_encoding(pool, sdk):
    lines = [
        {
            "custom_id": f"e-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": [TEXTS[i % 3], f"line {i}"]}
            | ({"encoding_format": "base64"} if i == 0 else {}),
        }
        for i in range(6)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    f = sdk.files.create(file=("in.jsonl", content), purpose="batch")
    batch = sdk.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.monotonic() + 120
    while (batch := sdk.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress", "finalizing")
        time.sleep(0.2)
    assert batch.request_counts.completed == 6 and batch.request_counts.failed == 0
    out = {
        row["custom_id"]: row["response"]
        for row in map(json.loads, sdk.files.content(batch.output_file_id).text.splitlines())
    }
    assert all(r["status_code"] == 200 and len(r["body"]["data"]) == 2 for r in out.values())
    assert isinstance(out["e-0"]["body"]["data"][0]["embedding"], str)  # base64, as the line asked
    assert len(out["e-1"]["body"]["data"][0]["embedding"]) == DIMENSIONS


def test_a_worker_killed_under_32_concurrent_requests_leaves_each_its_own_vectors(pool, sdk):
    """Every request is answered, once, with the vectors of its own inputs: each checked
    against the same input embedded alone afterwards."""
    requests = [[f"Request {i}, input {j}: {TEXTS[(i + j) % 3]}" for j in range(4)] for i in range(32)]
    victim = pool.workers["e1"]
    crashes = requeued_after_crashes(pool)
    with ThreadPoolExecutor(32) as ex:
        futures = [ex.submit(embed, sdk, texts) for texts in requests]
        wait_for_a_job_on(pool, b"e1")
        victim.popen.send_signal(signal.SIGKILL)  # a decode of its jobs' inputs takes seconds here
        answers = [f.result(timeout=180) for f in futures]
        assert requeued_after_crashes(pool) > crashes, "the kill took no job with it"
        texts = [t for inputs in requests for t in inputs]
        alone = list(ex.map(lambda t: vectors(embed(sdk, t))[0], texts))
    pool.start_embedder("e1")
    alone_all = np.stack(alone)
    for i, answer in enumerate(answers):
        assert [d.index for d in answer.data] == [0, 1, 2, 3]
        similar = vectors(answer) @ alone_all.T  # each input against every input embedded alone
        # its own input's vector, up to the rounding of other batch shapes, and none closer
        assert similar.argmax(axis=1).tolist() == list(range(4 * i, 4 * i + 4))
        assert np.all(similar.max(axis=1) > 0.999)


def test_a_worker_told_to_stop_hands_its_waiting_requests_to_another(pool, sdk):
    """SIGTERM with no grace: the requests it holds (slowed, still waiting for their vectors)
    are given back at once and answered by the other workers."""
    pool.start_embedder("e3", {"STEP_DELAY_SECONDS": "2", "SHUTDOWN_GRACE_SECONDS": "0"})
    stopping = pool.workers.pop("e3")
    try:
        wait_for_workers(pool, 3, stopping)
        requests = [[f"Handed off {i}.{j}: {TEXTS[j % 3]}" for j in range(2)] for i in range(8)]
        with ThreadPoolExecutor(8) as ex:
            futures = [ex.submit(embed, sdk, texts) for texts in requests]
            wait_for_a_job_on(pool, b"e3")
            stopping.popen.send_signal(signal.SIGTERM)
            answers = [f.result(timeout=120) for f in futures]
        assert stopping.popen.wait(30) == 0 and "handed off" in stopping.log()
    finally:
        stopping.stop()
    assert all(len(a.data) == 2 for a in answers)


def test_a_completion_cannot_name_the_embedding_pool(pool):
    with pool.http() as http:
        body = {"model": POOL, "messages": [{"role": "user", "content": "x"}]}
        resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
