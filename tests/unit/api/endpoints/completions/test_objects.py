"""api/endpoints/completions/objects.py: the legacy completions' `text_completion` objects, streamed
and whole, with a choice of plain text and logprobs in the legacy shape (tokens, token_logprobs,
top_logprobs by token, text_offset)."""

from __future__ import annotations

from api.endpoints.completions.objects import TextChunks
from api.jobs.state import JobState
from contract.entries import Delta, Failed, Finished, TokenLogprob
from contract.keys import JobStatus

DONE = Finished(finish_reason="length", prompt_tokens=2, completion_tokens=3)


def rows(*entries) -> list:
    return [(f"{n}-0", e) for n, e in enumerate(entries, 1)]


def lp(piece: bytes, logprob: float, *top: tuple[bytes, float]) -> TokenLogprob:
    return TokenLogprob(piece, logprob, top)


def test_a_streamed_chunk_is_a_text_choice_with_the_jobs_id_and_model():
    chunk = TextChunks("cmpl-1", 99, "m").delta(Delta(text="Hi", token_ids=(1,)))
    assert chunk == {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 99,
        "model": "m",
        "choices": [{"text": "Hi", "index": 0, "logprobs": None, "finish_reason": None}],
    }


def test_streamed_logprobs_are_in_the_legacy_shape_offsets_counting_characters():
    delta = Delta(
        text="héllo",
        token_ids=(1, 2, 3),
        logprobs=(
            lp(b"h\xc3\xa9", -0.1, (b"h\xc3\xa9", -0.1), (b"ha", -2.5)),
            lp(b"ll", -0.2, (b"ll", -0.2)),
            lp(b"o", -0.3),
        ),
    )
    choice = TextChunks("cmpl-1", 1, "m").delta(delta)["choices"][0]
    assert choice["text"] == "héllo" and choice["finish_reason"] is None
    assert choice["logprobs"] == {
        "tokens": ["hé", "ll", "o"],
        "token_logprobs": [-0.1, -0.2, -0.3],
        "top_logprobs": [{"hé": -0.1, "ha": -2.5}, {"ll": -0.2}, {}],
        "text_offset": [0, 2, 4],  # "hé" is 2 characters (3 bytes)
    }


def test_a_token_that_is_part_of_a_character_is_shown_with_the_replacement_character():
    delta = Delta(text="", token_ids=(1, 2), logprobs=(lp(b"\xe2\x82", -1.0), lp(b"\xac", -0.5)))
    got = TextChunks("cmpl-1", 1, "m").delta(delta)["choices"][0]["logprobs"]
    assert got["tokens"] == ["\ufffd", "\ufffd"] and got["text_offset"] == [0, 1]
    assert TextChunks("cmpl-1", 1, "m").delta(delta)["choices"][0]["text"] == ""


def test_the_whole_answer_joins_the_text_and_every_deltas_logprobs_offsets_from_the_start():
    c = TextChunks("cmpl-1", 7, "m")
    answer = c.answer(
        rows(
            Delta(text="ab", token_ids=(1,), logprobs=(lp(b"ab", -0.5),)),
            Delta(text="", token_ids=(2,)),  # held back: no logprobs in this one
            Delta(text="cde", token_ids=(3,), logprobs=(lp(b"cde", -1.5, (b"cde", -1.5)),)),
            DONE,
        )
    )
    assert answer is not None and answer.status == 200
    assert answer.body["object"] == "text_completion" and answer.body["created"] == 7
    assert answer.body["choices"] == [
        {
            "text": "abcde",
            "index": 0,
            "logprobs": {
                "tokens": ["ab", "cde"],
                "token_logprobs": [-0.5, -1.5],
                "top_logprobs": [{}, {"cde": -1.5}],
                "text_offset": [0, 2],
            },
            "finish_reason": "length",
        }
    ]
    assert answer.body["usage"]["total_tokens"] == 5


def test_an_answer_without_logprobs_says_null_and_a_cancelled_one_finishes_with_stop():
    c = TextChunks("cmpl-1", 1, "m")
    cancelled = Finished(finish_reason="cancelled", prompt_tokens=2, completion_tokens=1)
    answer = c.answer(rows(Delta(text="x", token_ids=(1,)), cancelled))
    assert answer is not None
    assert answer.body["choices"][0] == {"text": "x", "index": 0, "logprobs": None, "finish_reason": "stop"}
    assert c.finish(cancelled)["choices"][0]["finish_reason"] == "stop"


def test_a_failed_job_answers_with_its_error_not_a_completion():
    lost = Failed(message="out of memory", type="server_error", code="worker_lost")
    answer = TextChunks("cmpl-1", 1, "m").answer(rows(Delta(text="x", token_ids=(1,)), lost))
    assert answer is not None and answer.status == 503
    assert answer.body["error"]["code"] == "worker_lost" and "choices" not in answer.body


def test_its_status_objects_are_text_completions_built_from_the_job():
    job = JobState(id="cmpl-9", endpoint="text", model="m", created=3, owner="", status=JobStatus.RUNNING)
    c = TextChunks.of(job)
    assert isinstance(c, TextChunks) and (c.id, c.created, c.model) == ("cmpl-9", 3, "m")
    assert c.pending(queued=False).body == {
        "id": "cmpl-9",
        "object": "text_completion",
        "created": 3,
        "model": "m",
        "status": "in_progress",
    }
    assert c.deleted() == {"id": "cmpl-9", "object": "text_completion.deleted", "deleted": True}
    assert c.cancelled(JobStatus.RUNNING) == {
        "id": "cmpl-9",
        "object": "text_completion",
        "status": "cancelling",
    }
