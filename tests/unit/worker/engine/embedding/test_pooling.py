"""worker.engine.embedding.pooling: what a GGUF declares decides whether a worker embeds."""

from __future__ import annotations

import pytest
from gguf import PoolingType

from devstack import random_model
from worker.settings import default_model_path

pytest.importorskip("llama_cpp")
from worker.engine.embedding.pooling import declared_pooling

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")


def test_a_chat_model_declares_no_pooling():
    assert declared_pooling(default_model_path()) == ""


@pytest.mark.parametrize(
    ("kind", "name"), [(PoolingType.MEAN, "mean"), (PoolingType.CLS, "cls"), (PoolingType.LAST, "last")]
)
def test_an_embedding_models_pooling_is_read_from_its_file(tmp_path, kind, name):
    path = tmp_path / "embed.gguf"
    random_model.write("tiny", path, pooling=kind)
    assert declared_pooling(path) == name


def test_a_rerankers_file_declares_rank_pooling(tmp_path):
    path = tmp_path / "rank.gguf"
    random_model.write_reranker(path)
    assert declared_pooling(path) == "rank"
