"""devstack.random_model: `--rerank PATH` writes a BERT reranker llama.cpp reads as one."""

import pytest
from gguf import GGUFReader

from devstack import random_model
from worker.settings import default_model_path

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


def test_the_rerank_flag_writes_a_bert_with_rank_pooling_and_the_classifier_head(tmp_path):
    path = tmp_path / "r.gguf"
    random_model.main(["--rerank", str(path)])
    reader = GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "bert"
    assert reader.fields["bert.pooling_type"].contents() == 4  # LLAMA_POOLING_TYPE_RANK
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
    hidden = random_model.RERANK.hidden
    assert shapes["cls.weight"] == (hidden, hidden) and shapes["cls.bias"] == (hidden,)
    assert shapes["cls.output.weight"] == (hidden, 1) and shapes["cls.output.bias"] == (1,)


def test_without_rerank_the_shape_and_out_are_needed():
    with pytest.raises(SystemExit):
        random_model.main([])
