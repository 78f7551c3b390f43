"""contract.jobspec: a rank job's inputs, a query and its documents."""

import pytest

from contract.jobspec import InvalidSpec, JobSpec


def test_a_rank_job_round_trips():
    spec = JobSpec(id="rerank-1", kind="rank", model="m#rank", inputs=("q", "a", "b"), max_tokens=0)
    assert JobSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("inputs", [("q",), ("q", ""), ("q", (1, 2)), ()])
def test_a_rank_job_needs_a_query_and_documents_of_text(inputs):
    with pytest.raises(InvalidSpec):
        JobSpec.from_dict(
            JobSpec(id="r", kind="embed", model="m", inputs=("x",)).to_dict()
            | {"kind": "rank", "inputs": [list(x) if isinstance(x, tuple) else x for x in inputs]}
        )
