"""The holding job's banned tokens are exactly the default model's end tokens."""

from __future__ import annotations

import pytest

from tests.hold import END_TOKENS, holding_body
from worker.settings import default_model_path


def test_the_banned_tokens_are_every_end_token_of_the_default_model():
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp._internals import LlamaModel

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)
    ends = [t for t in range(model.n_vocab()) if llama_cpp.llama_vocab_is_eog(model.vocab, t)]
    assert tuple(ends) == END_TOKENS
    assert holding_body("m")["logit_bias"] == {str(t): -100 for t in ends}
