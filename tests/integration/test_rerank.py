"""`/v1/rerank` through real processes: a random-weight BERT cross-encoder (rank pooling,
`devstack.random_model --rerank`) served by two workers (its rerank pool), driven by the
cohere SDK's v1 and v2 clients, langchain-cohere and plain HTTP at the three paths; bad input
refused with nothing enqueued; and a worker SIGKILLed under 32 concurrent requests, each of
which still gets its own documents' scores."""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cohere
import httpx
import pytest
import redis

from contract import keys, stats, tiers
from devstack import random_model
from devstack.peek import job_ids, running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker
from tests.integration.conftest import strict_sdk

pytestmark = pytest.mark.integration

MODEL = "tiny-reranker"
POOL = tiers.rank_pool(MODEL)
# slowed, so that a kill lands mid-request; a short heartbeat, so that it is seen soon
RANK_ENV = {"SLOTS": "32", "HEARTBEAT_WINDOW_SECONDS": "2", "STEP_DELAY_SECONDS": "0.2", "MODEL_NAME": MODEL}
ROUNDING = 2e-3  # of a relevance score, between the same pair decoded in different company
QUERY = "What do giant pandas eat?"
DOCUMENTS = [
    "Giant pandas eat bamboo almost exclusively.",
    "The stock market closed higher on Friday.",
    "Pandas are bears native to China.",
    "Quarterly revenue grew by four percent.",
]


@dataclass
class Pool:
    base: str
    url: str
    r: redis.Redis
    logs: object
    path: str
    workers: dict[str, Proc]

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=180)

    def waiting(self) -> int:
        return sum(self.r.llen(k) for k in keys.queue_keys(POOL))

    def start_ranker(self, name: str) -> None:
        env = {**RANK_ENV, "MODEL_PATH": self.path}
        self.workers[name] = start_worker(self.logs, self.url, name=name, env=env)

    def models(self) -> dict[str, dict]:
        with self.http() as http:
            return {m["id"]: m for m in http.get("/v1/models").json()["data"]}

    def wait_for_workers(self, n: int) -> None:
        deadline = time.monotonic() + 180
        while self.models().get(MODEL, {}).get("rerank_workers") != n:
            assert time.monotonic() < deadline, f"not {n} rerank workers"
            assert all(p.alive() for p in self.workers.values()), "a rerank worker died"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    logs = tmp_path_factory.mktemp("rerank")
    path = logs / "tiny-reranker.gguf"
    random_model.write_reranker(path)
    redis_proc, url = start_redis(logs)
    env = {
        "KEEPALIVE_SECONDS": "0.5",
        "REAPER_INTERVAL_SECONDS": "0.2",
        "MAX_RERANK_DOCUMENTS": "16",
        "BATCH_INTERVAL_SECONDS": "0.1",
    }
    api, base = start_api(logs, url, env=env)
    p = Pool(base, url, redis.Redis.from_url(url), logs, str(path), {})
    p.start_ranker("r1")
    p.start_ranker("r2")
    try:
        p.wait_for_workers(2)
        yield p
    finally:
        for proc in (*p.workers.values(), api, redis_proc):
            proc.stop()


@pytest.fixture
def v1(pool) -> cohere.Client:
    return cohere.Client(api_key="unused", base_url=pool.base, timeout=180)


@pytest.fixture
def v2(pool) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=pool.base, timeout=180)


def rerank(pool: Pool, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    with pool.http() as http:
        return http.post(path, json={"model": MODEL, **body})


def scores(answer: dict) -> dict[int, float]:
    """Each document's score, by its index."""
    return {r["index"]: r["relevance_score"] for r in answer["results"]}


def test_the_v1_client_gets_its_own_shapes_best_first(v1):
    got = v1.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, return_documents=True)
    values = [r.relevance_score for r in got.results]
    assert sorted(r.index for r in got.results) == [0, 1, 2, 3]
    assert values == sorted(values, reverse=True) and all(0 < v < 1 for v in values)
    assert [r.document.text for r in got.results] == [DOCUMENTS[r.index] for r in got.results]
    assert len(set(values)) == 4  # random weights, but each document its own score


def test_the_v1_client_takes_document_objects_and_top_n(v1):
    whole = v1.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS)
    top = v1.rerank(model=MODEL, query=QUERY, documents=[{"text": d} for d in DOCUMENTS], top_n=2)
    assert [r.index for r in top.results] == [r.index for r in whole.results][:2]
    assert all(r.document is None for r in top.results)  # not asked for


def test_the_v2_client_and_the_three_paths_agree(pool, v2):
    got = v2.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert len(got.results) == 3
    answers = [
        rerank(pool, {"query": QUERY, "documents": DOCUMENTS}, path).json()
        for path in ("/v1/rerank", "/v2/rerank", "/rerank")
    ]
    first = scores(answers[0])
    assert all(scores(a) == pytest.approx(first, abs=ROUNDING) for a in answers)
    assert [r.index for r in got.results] == [r["index"] for r in answers[0]["results"]][:3]
    usage = answers[0]["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 4 * 10  # every pair's tokens


def test_langchain_cohere_reranks_against_the_base_url(pool):
    from langchain_cohere import CohereRerank

    ranker = CohereRerank(model=MODEL, cohere_api_key="unused", base_url=pool.base, top_n=3)
    got = ranker.rerank(documents=DOCUMENTS[:2], query=QUERY)  # its top_n above the count: all
    assert sorted(r["index"] for r in got) == [0, 1]


def test_llamaindex_cohere_and_jina_postprocessors_rerank_nodes_against_the_stack(pool):
    pytest.importorskip("llama_index.postprocessor.jinaai_rerank")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    nodes = [NodeWithScore(node=TextNode(text=d), score=0.0) for d in DOCUMENTS]
    expected = rerank(pool, {"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()["results"]
    for ranker in (
        CohereRerank(top_n=2, model=MODEL, api_key="unused", base_url=pool.base),
        JinaRerank(top_n=2, model=MODEL, api_key="unused", base_url=pool.base + "/v1"),
    ):
        got = ranker.postprocess_nodes(nodes, QueryBundle(QUERY))
        assert [n.node.get_content() for n in got] == [DOCUMENTS[r["index"]] for r in expected]
        assert [n.score for n in got] == pytest.approx([r["relevance_score"] for r in expected], abs=ROUNDING)


def test_identical_pairs_score_alike_alone_and_among_other_requests(pool):
    body = {"query": QUERY, "documents": [DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[0]]}
    alone = scores(rerank(pool, body).json())
    assert alone[0] == pytest.approx(alone[2], abs=1e-6)  # the same pair twice in one request
    others = [
        {"query": f"Question {i}?", "documents": [f"Answer {i} of {j}." for j in range(4)]} for i in range(12)
    ]
    with ThreadPoolExecutor(13) as ex:
        futures = [ex.submit(rerank, pool, b) for b in others[:6]]
        mine = ex.submit(rerank, pool, body)
        futures += [ex.submit(rerank, pool, b) for b in others[6:]]
        together = scores(mine.result(timeout=180).json())
        assert all(f.result(timeout=180).status_code == 200 for f in futures)
    # decoded beside others: f16 rounding (the file's weights, as a real reranker's, and
    # flash attention), far below what tells two documents apart
    assert together == pytest.approx(alone, abs=ROUNDING)
    assert abs(alone[0] - alone[1]) > 50 * ROUNDING


def test_raw_scores_by_the_setting_are_the_logits_of_the_relevance_scores(pool):
    api, base = start_api(pool.logs, pool.url, env={"RERANK_RAW_SCORES": "1"}, name="api-raw")
    try:
        with httpx.Client(base_url=base, timeout=180) as http:
            raw = scores(
                http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCUMENTS}).json()
            )
    finally:
        api.stop()
    relevance = scores(rerank(pool, {"query": QUERY, "documents": DOCUMENTS}).json())
    assert any(not 0 <= v <= 1 for v in raw.values())  # a raw score is the model's, unbounded
    assert {i: 1 / (1 + math.exp(-v)) for i, v in raw.items()} == pytest.approx(relevance, abs=1e-6)


def test_a_keys_token_budget_counts_rerank_tokens(pool):
    """A pair reserves its texts' bytes and the frame the workers announced; the key is
    charged what the pairs were, and a request reserving more than is left is a 429."""
    auth = {"authorization": "Bearer sk-rank"}
    api, base = start_api(
        pool.logs, pool.url, name="api-keys", env={"API_KEYS": "sk-rank", "KEY_TOKENS_PER_MINUTE": "100"}
    )
    try:
        with httpx.Client(base_url=base, timeout=180, headers=auth) as http:
            deadline = time.monotonic() + 60
            while not http.get(f"/v1/models/{MODEL}").is_success:
                assert time.monotonic() < deadline and api.alive()
                time.sleep(0.2)
            first = http.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a", "b"]})
            big = http.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["x" * 50] * 2})
    finally:
        api.stop()
    assert first.status_code == 200 and first.json()["usage"]["prompt_tokens"] == 2 * (1 + 4 + 1)
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= 100 - 12
    assert big.status_code == 429 and "tokens" in big.json()["error"]["message"]


def test_the_pool_counts_its_pairs_and_tokens_under_its_own_name(pool):
    assert rerank(pool, {"query": QUERY, "documents": DOCUMENTS}).status_code == 200
    label = f'model="{POOL}"'
    deadline = time.monotonic() + 30
    with pool.http() as http:
        while True:  # the workers add their counters with each announcement
            lines = http.get("/metrics").text.splitlines()
            counted = {
                ln.split("{")[0]: float(ln.rsplit(" ", 1)[1])
                for ln in lines
                if label in ln and ln.startswith(("tokenspool_batch_sequences", "tokenspool_batch_prefill"))
            }
            if counted.get("tokenspool_batch_sequences_total", 0) >= 4:
                break
            assert time.monotonic() < deadline, counted
            time.sleep(0.5)
    assert counted["tokenspool_batch_prefill_tokens_total"] >= 4 * 10
    assert any(ln.startswith("tokenspool_queue_depth{") and label in ln for ln in lines)


def test_the_models_list_names_the_kind(pool):
    listed = pool.models()[MODEL]
    assert listed["kinds"] == ["rerank"] and listed["rerank_workers"] == 2 and listed["workers"] == 0
    with pool.http() as http:
        scaling = http.get(f"/scaling/{MODEL}", params={"kind": "rerank"})
        chat = http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
        )
    if scaling.status_code != 401:  # an operator route; open on a keyless stack
        assert scaling.json()["model"] == POOL and scaling.json()["workers"] == 2
    assert chat.status_code == 404  # its chat pool has no worker


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": 5, "documents": ["a"]}, "query"),
        ({"documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", ""]}, "documents"),
        ({"query": "q", "documents": [{"title": "a"}]}, "documents"),
        ({"query": "q", "documents": ["a"] * 17}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ({"query": "q", "documents": ["a"], "temperature": 1}, "temperature"),
        ({"query": "q", "documents": ["a"], "stream": True}, "stream"),
        ({"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
        ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 8}, "max_tokens_per_doc"),
        ({"query": "q", "documents": ["a", "word " * 2000]}, "documents[1]"),  # past 16 chars a token
    ],
)
def test_bad_input_is_a_400_naming_it_with_nothing_enqueued(pool, body, param):
    before = len(job_ids(pool.r))
    resp = rerank(pool, body)
    assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(param), resp.text
    assert len(job_ids(pool.r)) == before and pool.waiting() == 0


def test_a_pair_longer_than_the_model_reads_is_a_400_naming_its_document(pool):
    resp = rerank(pool, {"query": QUERY, "documents": ["short", "word " * 600]})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == "documents[1]"
    assert error["code"] == "context_length_exceeded"


def test_a_batch_of_rerank_lines_answers_each(pool):
    sdk = strict_sdk(pool.base)
    lines = [
        {
            "custom_id": f"r-{i}",
            "method": "POST",
            "url": "/v1/rerank",
            "body": {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "top_n": 1 + i % 4},
        }
        for i in range(4)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    f = sdk.files.create(file=("in.jsonl", content), purpose="batch")
    batch = sdk.batches.create(input_file_id=f.id, endpoint="/v1/rerank", completion_window="24h")  # type: ignore[arg-type]
    deadline = time.monotonic() + 180
    while (batch := sdk.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress", "finalizing")
        time.sleep(0.2)
    out = {
        row["custom_id"]: row["response"]
        for row in map(json.loads, sdk.files.content(batch.output_file_id).text.splitlines())
    }
    assert all(out[f"r-{i}"]["status_code"] == 200 for i in range(4))
    assert [len(out[f"r-{i}"]["body"]["results"]) for i in range(4)] == [1, 2, 3, 4]


def requeued_after_crashes(pool: Pool) -> int:
    return int(pool.r.hget(keys.STATS, stats.StatField.requeued("crash")) or 0)


def wait_for_a_job_on(pool: Pool, worker: bytes) -> None:
    deadline = time.monotonic() + 120
    while not any(pool.r.hget(keys.job(j), keys.JobField.WORKER) == worker for j in running_ids(pool.r)):
        assert time.monotonic() < deadline, f"no job reached {worker.decode()}"
        time.sleep(0.02)


def test_a_worker_killed_under_32_concurrent_requests_leaves_each_its_own_scores(pool):
    """Every request is answered, with its own documents' scores: each checked against the
    same request scored afterwards, on the worker left."""
    bodies = [
        {
            "query": f"Question {i}: {QUERY}",
            "documents": [f"Document {i}.{j}: {DOCUMENTS[(i + j) % 4]}" for j in range(4)],
        }
        for i in range(32)
    ]
    victim = pool.workers["r1"]
    crashes = requeued_after_crashes(pool)
    with ThreadPoolExecutor(32) as ex:
        futures = [ex.submit(rerank, pool, b) for b in bodies]
        wait_for_a_job_on(pool, b"r1")
        victim.popen.send_signal(signal.SIGKILL)
        answers = [f.result(timeout=300) for f in futures]
        assert requeued_after_crashes(pool) > crashes, "the kill took no job with it"
        again = list(ex.map(lambda b: rerank(pool, b), bodies))
    pool.start_ranker("r1")
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    for answer, check in zip(answers, again, strict=True):
        assert scores(answer.json()) == pytest.approx(scores(check.json()), abs=ROUNDING)
    pool.wait_for_workers(2)
