"""worker.engine.embedding.rank: pairs framed as llama-server frames them, cut or refused at
the context, and one score each from the random BERT reranker (devstack.random_model)."""

from __future__ import annotations

import array
import math

import pytest

from devstack import random_model
from worker.settings import WorkerSettings, default_model_path

pytest.importorskip("llama_cpp")
from contract.jobspec import JobSpec
from worker.engine.embedding.rank import Frame, RankEngine, log_odds
from worker.errors import PromptRejected

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank") / "reranker.gguf"
    random_model.write_reranker(out)
    return out


def engine(path, **env) -> RankEngine:
    return RankEngine(WorkerSettings.from_env({"MODEL_PATH": str(path), "MODEL_NAME": "r", **env}))


def job(*inputs: str) -> JobSpec:
    return JobSpec(id="rerank-1", kind="rank", model="r#rank", inputs=inputs, max_tokens=0)


def scores(e: RankEngine, ids: list[list[int]]) -> list[float]:
    packed = e.embed(ids)
    assert packed is not None
    return array.array("f", packed).tolist()


def test_a_pair_is_bos_query_eos_sep_document_eos_and_gets_one_score(path):
    e = engine(path)
    try:
        assert e.model_name == "r#rank" and e.dimensions == 1 and not e.softmax
        assert e.frame == Frame(head=[1], middle=[2, 0], tail=[2])  # the file's BOS, EOS, SEP
        assert e.prompt_overhead is not None and e.prompt_overhead.per_part == 4
        q, d = (e._model.tokenize(t.encode(), add_bos=False, special=False) for t in ("pandas", "bamboo"))
        ids = e.input_ids(job("pandas", "bamboo", "<|im_start|>"))
        assert ids[0] == [1, *q, 2, 0, *d, 2]
        assert 1 not in ids[1][1:]  # a document's control-token text stays text
        got = scores(e, [*ids, ids[0]])
        assert len(got) == 3 and got[0] == pytest.approx(got[2], abs=1e-3) and got[0] != got[1]
    finally:
        e.close()


def test_a_pair_past_the_context_names_its_document_or_is_cut_with_rerank_truncate(path):
    long = "word " * 40
    refusing = engine(path, N_CTX="24")
    try:
        with pytest.raises(PromptRejected) as e:
            refusing.input_ids(job("q", "short", long))
        assert e.value.param == "documents[1]"
        with pytest.raises(PromptRejected) as e:
            refusing.input_ids(job(long, "short"))
        assert e.value.param == "query"  # never cut
    finally:
        refusing.close()
    cutting = engine(path, N_CTX="24", RERANK_TRUNCATE="1")
    try:
        ids = cutting.input_ids(job("q", "short", long))
        assert len(ids[1]) == 24 and ids[1][-1] == 2 and ids[1][:4] == ids[0][:4]  # the query kept
        assert len(scores(cutting, ids)) == 2
    finally:
        cutting.close()


def test_a_rerank_worker_refuses_an_embed_job(path):
    e = engine(path)
    try:
        with pytest.raises(PromptRejected):
            e.input_ids(JobSpec(id="embd-1", kind="embed", model="r#rank", inputs=("x",), max_tokens=0))
    finally:
        e.close()


def test_a_softmax_head_s_probability_becomes_the_score_whose_sigmoid_it_is():
    for p in (0.01, 0.5, 0.9986):
        assert 1 / (1 + math.exp(-log_odds(p))) == pytest.approx(p)
    assert math.isfinite(log_odds(0.0)) and math.isfinite(log_odds(1.0))
