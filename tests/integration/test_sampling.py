"""worker.engine.sampling with the real model: the greedy shortcut picks what llama.cpp's own
greedy sampler picks, and penalties still go through llama.cpp's chain."""

from __future__ import annotations

import llama_cpp
import pytest

from contract.jobspec import JobSpec
from worker.engine.sampling import Sampler
from worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

ROWS = 4


@pytest.fixture(scope="module")
def decoded():
    """A context whose last batch left logits on ROWS rows (four different prompts)."""
    from worker.engine.model import LlamaEngine

    engine = LlamaEngine(WorkerSettings.from_env({"REDIS_URL": "unused", "SLOTS": str(ROWS), "N_CTX": "512"}))
    engine.close()  # only its context is used here: no scheduler thread decoding besides
    ctx, n_vocab = engine._ctx, engine._n_vocab
    texts = ("The sky is", "1, 2, 3,", "Paris is the", "def f(")
    prompts = [engine.prompt_ids(spec(prompt=t)) for t in texts]
    rows = [(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
    batch = llama_cpp.llama_batch_init(len(rows), 0, 1)
    for i, (tok, pos, seq, logits) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
    batch.n_tokens = len(rows)
    assert llama_cpp.llama_decode(ctx, batch) == 0
    return ctx, n_vocab, [i for i, r in enumerate(rows) if r[3]]


def spec(**kw) -> JobSpec:
    return JobSpec(id="cmpl-1", kind="completion", model="m", **{"prompt": "x", **kw})


def native_greedy(ctx, index: int) -> int:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    try:
        return llama_cpp.llama_sampler_sample(chain, ctx, index)
    finally:
        llama_cpp.llama_sampler_free(chain)


def test_greedy_takes_the_token_llama_cpps_greedy_sampler_takes(decoded):
    ctx, n_vocab, indices = decoded
    picks = []
    for index in indices:
        sampler = Sampler(spec(temperature=0), n_vocab, 512)
        picks.append(sampler.sample(ctx, index).token)
        sampler.close()
    assert picks == [native_greedy(ctx, i) for i in indices]
    assert len(set(picks)) > 1  # four prompts, not one row read four times


def test_penalties_still_change_a_greedy_pick(decoded):
    ctx, n_vocab, indices = decoded
    index = indices[0]
    top = native_greedy(ctx, index)
    sampler = Sampler(spec(temperature=0, frequency_penalty=2.0), n_vocab, 512, generated=[top] * 50)
    assert sampler.sample(ctx, index).token != top  # the chain counted the earlier tokens
    sampler.close()
