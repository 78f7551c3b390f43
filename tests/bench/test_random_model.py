"""devstack/random_model.py's vocabulary padding: a model padded to Llama 3's 128,256 tokens loads
in llama.cpp with that many rows of logits, and tokenizes, templates and stops exactly as the
unpadded one (the GPU benchmark's 8B shape pays for Llama 3's output matrix, nothing else)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, TokenType

from contract.jobspec import JobSpec, Message
from devstack import random_model
from worker.settings import default_model_path

llama_cpp = pytest.importorskip("llama_cpp")

LLAMA3 = 128_256

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("random")
    paths = {"plain": out / "plain.gguf", "padded": out / "padded.gguf"}
    random_model.write("tiny", paths["plain"])
    random_model.main(["--shape", "tiny", "--out", str(paths["padded"]), "--vocab", str(LLAMA3)])
    return paths


def load(path: Path):
    return llama_cpp.Llama(model_path=str(path), vocab_only=False, n_ctx=256, verbose=False)


def test_the_padded_file_has_llama_3_s_rows_and_normal_tokens_of_their_own(models):
    reader = GGUFReader(models["padded"])
    tensors = {t.name: t for t in reader.tensors}
    hidden = random_model.SHAPES["tiny"].hidden
    for name in ("token_embd.weight", "output.weight"):
        assert tensors[name].shape.tolist() == [hidden, LLAMA3]
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == LLAMA3 == len(set(tokens))
    assert reader.fields["llama.vocab_size"].contents() == LLAMA3
    assert set(types[random_model.VOCAB :]) == {TokenType.NORMAL}
    plain = GGUFReader(models["plain"])
    assert tokens[: random_model.VOCAB] == plain.fields["tokenizer.ggml.tokens"].contents()
    assert types[: random_model.VOCAB] == plain.fields["tokenizer.ggml.token_type"].contents()
    with pytest.raises(ValueError, match="smaller"):
        random_model.write("tiny", models["plain"].with_name("small.gguf"), vocab=1000)


def test_a_padded_model_prompts_and_stops_as_the_unpadded_one_and_decodes_every_row(models):
    from worker.engine.prompts import ChatPrompts

    plain, padded = load(models["plain"]), load(models["padded"])
    assert (plain.n_vocab(), padded.n_vocab()) == (random_model.VOCAB, LLAMA3)
    a, b = ChatPrompts(plain._model), ChatPrompts(padded._model)
    spec = JobSpec(
        id="chatcmpl-t",
        kind="chat",
        model="m",
        messages=(
            Message("system", "You are terse."),
            Message("user", "Hello there! What's 2+2? pad50000 <|im_end|> <unused0> ünïcødé 🙂"),
        ),
    )
    ids = a.prompt_ids(spec, 256)
    assert b.prompt_ids(spec, 256) == ids and max(ids) < random_model.VOCAB
    raw = b"<|im_start|>user\n pad49152 pad128255 hi<|im_end|>\n"  # a raw prompt: special parsing
    assert padded.tokenize(raw, special=True) == plain.tokenize(raw, special=True)
    assert (b.ends, b.controls) == (a.ends, a.controls)
    assert b.piece(LLAMA3 - 1) == b" pad128255"  # a sampled padding token streams a word

    rows = []
    for model in (plain, padded):  # Llama.scores holds logits only with logits_all: the context's
        model.eval(ids)
        logits = llama_cpp.llama_get_logits_ith(model.ctx, -1)
        rows.append(np.ctypeslib.as_array(logits, shape=(model.n_vocab(),)).copy())
    assert np.isfinite(rows[1]).all()
    assert rows[1][random_model.VOCAB :].std() > 0.01  # the padding rows' logits are computed
    # the same weights up to the padding (one pool of random bytes, tiled), so the same logits
    np.testing.assert_allclose(rows[1][: random_model.VOCAB], rows[0], rtol=1e-4, atol=1e-4)
