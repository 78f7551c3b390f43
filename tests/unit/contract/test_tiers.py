"""contract.tiers: a model's pools of each kind, and the jobs each runs."""

import pytest

from contract import tiers


@pytest.mark.parametrize(
    ("pool", "served"),
    [("m", ("m", "chat")), ("m#embed", ("m", "embeddings")), ("m#rank", ("m", "rerank"))],
)
def test_each_pool_names_its_model_and_kind(pool, served):
    assert tiers.served_model(pool) == served
    assert tiers.embedding_pool("m") == "m#embed" and tiers.rank_pool("m") == "m#rank"


def test_each_kind_of_pool_runs_its_own_jobs():
    assert tiers.JOB_KINDS == {"chat": ("chat", "text"), "embeddings": ("embed",), "rerank": ("rank",)}
