"""api.endpoints.rerank.routes: what a rank job reserves of its key's token budget."""

from api.endpoints.rerank.routes import pair_tokens
from api.jobs.reservation import plain
from contract.jobspec import JobSpec


def test_each_pair_reserves_its_texts_as_plain_text_and_the_frame_the_workers_announced():
    spec = JobSpec(id="rerank-1", kind="rank", model="m#rank", inputs=("query", "doc", "ünï"), max_tokens=0)
    frame = 4
    assert pair_tokens(spec, frame) == 2 * (plain("query") + frame) + plain("doc") + plain("ünï")
    assert plain("ünï") == len("ünï".encode()) + 1  # a token a byte: no tokenizer makes more
