"""worker.engine.sampling without a model: a step's plain rows picked together, each its own
biased argmax, and the other rows left to their own samplers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup): tests/unit runs without it
from contract.jobspec import JobSpec
from worker.engine import sampling
from worker.engine.sampling import Sampler, pick_rows
from worker.errors import GrammarDeadEnd

VOCAB = 1000


def greedy(**kw) -> Sampler:
    spec = JobSpec(id="c", kind="completion", model="m", prompt="x", temperature=0.0, **kw)
    return Sampler(spec, VOCAB, 64)


def logits(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, VOCAB), dtype=np.float32)


def test_plain_rows_take_their_own_argmax():
    table = logits(6)
    picks = pick_rows([greedy() for _ in range(6)], table.copy())
    assert [p.token for p in picks] == table.argmax(axis=1).tolist()


def test_each_row_gets_its_own_bias_and_the_last_of_a_repeated_token_wins():
    table = logits(4, seed=1)
    tops = table.argmax(axis=1).tolist()
    samplers = [
        greedy(),
        greedy(logit_bias=((tops[1], -100.0),)),
        greedy(logit_bias=((tops[2], 5.0), (tops[2], -100.0))),
        greedy(logit_bias=((tops[1], -100.0),)),
    ]
    picks = [p.token for p in pick_rows(samplers, table.copy())]
    second = [int(np.argsort(r)[-2]) for r in table]
    assert picks[0] == tops[0] and picks[1] == second[1] and picks[2] == second[2]
    expected3 = table[3].copy()
    expected3[tops[1]] -= 100.0
    assert picks[3] == int(expected3.argmax())


def test_a_token_past_the_vocabulary_in_a_bias_is_ignored():
    table = logits(1, seed=2)
    picks = pick_rows([greedy(logit_bias=((VOCAB + 5, 50.0),))], table.copy())
    assert picks[0].token == int(table[0].argmax())


def test_ties_go_to_the_first_highest_token():
    table = np.zeros((2, VOCAB), dtype=np.float32)
    table[:, [7, 3, 9]] = 1.0
    assert [p.token for p in pick_rows([greedy(), greedy()], table)] == [3, 3]


class _Own:
    """A row that is not plain: picks by itself, as a grammar's or a sampled job's does."""

    plain = False
    bias = None

    def __init__(self, token: int | None) -> None:
        self.token, self.rows = token, []

    def sample(self, row):
        self.rows.append(row.copy())
        if self.token is None:
            raise GrammarDeadEnd("nothing fits")
        return sampling.Pick(self.token)


def test_rows_that_pick_by_themselves_get_their_unbiased_row_between_plain_runs():
    table = logits(5, seed=3)
    own, dead = _Own(42), _Own(None)
    samplers = [greedy(logit_bias=((1, 9.0),)), own, greedy(), dead, greedy()]
    picks = pick_rows(samplers, table.copy())
    assert picks[1].token == 42 and isinstance(picks[3], GrammarDeadEnd)
    assert np.array_equal(own.rows[0], table[1]) and np.array_equal(dead.rows[0], table[3])
    biased = table[0].copy()
    biased[1] += 9.0
    assert [picks[0].token, picks[2].token, picks[4].token] == [
        int(biased.argmax()),
        int(table[2].argmax()),
        int(table[4].argmax()),
    ]


@pytest.mark.parametrize(
    ("rows", "runs"),
    [([], []), ([0, 1, 2], [(0, 3)]), ([0, 2, 3, 7], [(0, 1), (2, 4), (7, 8)]), ([5], [(5, 6)])],
)
def test_runs_of_consecutive_rows(rows, runs):
    assert list(sampling._runs(rows)) == runs


def test_only_a_greedy_job_without_logprobs_is_plain():
    assert greedy().plain and greedy(logit_bias=((1, 1.0),)).plain
    assert not greedy(logprobs=True).plain
    sampled = Sampler(JobSpec(id="c", kind="completion", model="m", prompt="x", temperature=0.7), VOCAB, 64)
    assert not sampled.plain
    sampled.close()
    penalised = greedy(frequency_penalty=1.0)
    assert not penalised.plain
    penalised.close()


def test_a_long_run_split_over_threads_picks_what_one_pass_picks():
    from worker.engine.argmax import MIN_SHARE, RowsArgmax

    rows = 2 * MIN_SHARE // VOCAB + 7  # two shares and a remainder
    table = logits(rows, seed=4)
    argmax = RowsArgmax(3)
    try:
        picks = pick_rows([greedy(logit_bias=((5, 3.0),)) for _ in range(rows)], table.copy(), argmax)
    finally:
        argmax.close()
    table[:, 5] += 3.0
    assert [p.token for p in picks] == table.argmax(axis=1).tolist()
