"""What unit tests of several folders share: llama.cpp's grammar engine, held on the
default model's vocabulary (skipped where llama_cpp or the GGUF is missing)."""

from __future__ import annotations

import pytest

from worker.settings import default_model_path


@pytest.fixture(scope="module")
def accepts():
    """Whether llama.cpp's grammar engine takes `text` whole (every token, then the end)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if default_model_path() is None:
        pytest.skip("no SmolLM2 GGUF: run scripts/setup")
    from llama_cpp._internals import LlamaModel

    from worker.engine.grammar import GrammarGate
    from worker.errors import GrammarDeadEnd

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)
    end = llama_cpp.llama_vocab_eos(model.vocab)

    def check(gbnf: str, text: str) -> bool:
        gate = GrammarGate(model.vocab, gbnf, [])
        try:
            for token in model.tokenize(text.encode(), add_bos=False, special=False):
                gate.accept(token)
            return gate.allows(end)
        except GrammarDeadEnd:
            return False
        finally:
            gate.close()

    return check
