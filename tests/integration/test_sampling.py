"""worker.engine.sampling with the real model: the greedy rows picked together take what
llama.cpp's own greedy sampler takes, a sampled row what `llama_sampler_sample` draws with the
same chain and seed, penalties still go through llama.cpp's chain; and worker.engine.context
reads a step's logits as llama.cpp lays them out."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from contract.jobspec import JobSpec
from worker.engine.context import NativeContext, StepBatch
from worker.engine.sampling import Sampler, pick_rows
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
    batch = StepBatch(len(rows) + 3)
    batch.fill(*(list(column) for column in zip(*rows, strict=True)))
    assert NativeContext(ctx, n_vocab).decode(batch) == 0
    return ctx, n_vocab, [i for i, r in enumerate(rows) if r[3]]


def row(ctx, n_vocab: int, index: int) -> np.ndarray:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(n_vocab,)).copy()


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
        picks.append(sampler.sample(row(ctx, n_vocab, index)).token)
        sampler.close()
    assert picks == [native_greedy(ctx, i) for i in indices]
    assert len(set(picks)) > 1  # four prompts, not one row read four times


def test_penalties_still_change_a_greedy_pick(decoded):
    ctx, n_vocab, indices = decoded
    index = indices[0]
    top = native_greedy(ctx, index)
    sampler = Sampler(spec(temperature=0, frequency_penalty=2.0), n_vocab, 512, generated=[top] * 50)
    assert sampler.sample(row(ctx, n_vocab, index)).token != top  # the chain counted the earlier tokens
    sampler.close()


def test_a_step_s_logits_are_its_rows_in_batch_order(decoded):
    ctx, n_vocab, indices = decoded
    logits = NativeContext(ctx, n_vocab).logits(len(indices))
    assert logits.shape == (ROWS, n_vocab)
    for k, index in enumerate(indices):
        assert np.array_equal(logits[k], row(ctx, n_vocab, index))


def test_greedy_rows_picked_together_take_llama_cpps_greedy_tokens(decoded):
    ctx, n_vocab, indices = decoded
    samplers = [Sampler(spec(temperature=0), n_vocab, 512) for _ in indices]
    logits = np.stack([row(ctx, n_vocab, i) for i in indices])
    assert [p.token for p in pick_rows(samplers, logits)] == [native_greedy(ctx, i) for i in indices]


def test_a_biased_greedy_row_picked_with_others_loses_its_banned_token(decoded):
    ctx, n_vocab, indices = decoded
    top = native_greedy(ctx, indices[1])
    samplers = [Sampler(spec(temperature=0, logit_bias=((top, -100.0),)), n_vocab, 512) for _ in indices]
    logits = np.stack([row(ctx, n_vocab, i) for i in indices])
    expected = []
    for k in range(ROWS):
        biased = logits[k].copy()
        biased[top] -= 100.0
        expected.append(int(biased.argmax()))
    picks = [p.token for p in pick_rows(samplers, logits)]
    assert picks == expected and picks[1] != top


@pytest.mark.parametrize("extra", [{}, {"top_k": 40, "min_p": 0.05}, {"presence_penalty": 0.5}])
def test_a_sampled_row_draws_what_llama_sampler_sample_draws(decoded, extra):
    """The same chain and seed over the row the context holds: the same tokens, draw after draw."""
    ctx, n_vocab, indices = decoded
    for index in indices:
        ours = Sampler(spec(temperature=0.9, top_p=0.9, seed=7, **extra), n_vocab, 512)
        theirs = Sampler(spec(temperature=0.9, top_p=0.9, seed=7, **extra), n_vocab, 512)
        logits = row(ctx, n_vocab, index)
        drawn = [ours.sample(logits).token for _ in range(20)]
        native = [llama_cpp.llama_sampler_sample(theirs._chain, ctx, index) for _ in range(20)]
        assert drawn == native
        ours.close()
        theirs.close()
