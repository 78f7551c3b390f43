"""worker/attempts/budget.py: a thinking budget closes the block itself once the job has thought that
many tokens (earlier attempts' included), once, and starts the engine's picks again after the close;
without a budget the engine's picks pass untouched."""

from __future__ import annotations

from contract.jobspec import JobSpec, Message
from worker.attempts.attempt import Attempt
from worker.attempts.budget import bounded
from worker.attempts.sender import Sender
from worker.engine.protocol import Generation
from worker.engine.steps.picks import Pick
from worker.text.replies import PlainReply
from worker.text.textstream import Piece
from worker.text.thinking import Thinking

PROMPT = [100, 101]
WORDS = {11: "Hmm", 12: ", so", 13: "</think>", 14: "\n\n", 15: "Yes", 16: "."}
CLOSE = [13, 14]


class Engine:
    """Thinks on until its block is closed for it, then answers: a new script for each call."""

    def __init__(self, scripts: list[list[int]]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[list[int], object]] = []  # each call's context after the prompt, and `cached`
        self.log: list[str] = []  # each call's start, and its end with the tokens it had yielded
        self.running: list = []

    def piece(self, token: int) -> bytes:
        return WORDS[token].encode()

    def close_thinking(self, spec: JobSpec) -> list[int]:
        return list(CLOSE)

    def tokens(self, job: Generation):
        assert job.prompt == PROMPT and job.progress is None and job.alone_for == 4 and job.since_ms == 7
        script = self.scripts[min(len(self.calls), len(self.scripts) - 1)]
        self.calls.append((list(job.prior), job.cached))
        picks = self._picks(script)
        self.running.append(picks)  # held, as a batch holds its sequences: only a close ends it
        return picks

    def _picks(self, script: list[int]):
        self.log.append("start")
        n = 0
        try:
            for token in script:
                n += 1
                yield Pick(token, -1.0), self.piece(token)
        finally:
            self.log.append(f"end after {n}")


def spec(budget: int) -> JobSpec:
    return JobSpec(
        id="chatcmpl-b", kind="chat", model="m", messages=(Message("user", "hi"),), thinking_budget=budget
    )


class Quiet:
    """Stands in for the publisher: nothing here reads the stream."""

    def delta(self, attempt, text, token_ids, calls=(), logprobs=(), reasoning=""):
        pass


def cached(tokens: int) -> None:
    pass


def run(engine: Engine, budget: int, prior=(), reply=None, stop_after: int = 99) -> tuple[list[Pick], Sender]:
    """As the attempt's loop does: each pick read by the sender before the next is asked for."""
    reply = Thinking(PlainReply(), opened=True) if reply is None else reply
    out = Sender(engine.piece, Quiet(), Attempt("chatcmpl-b", 1), reply, False, list(prior))  # type: ignore[arg-type]
    job = Generation(spec(budget), PROMPT, list(prior), alone_for=4, since_ms=7, cached=cached)
    picks = bounded(engine, job, out)
    got = []
    for pick, piece in picks:
        assert piece == engine.piece(pick.token)
        got.append(pick)
        out.picked(pick, piece)
        out.send(Piece(piece.decode(), (pick.token,)))
        if len(got) == stop_after:
            break
    picks.close()
    return got, out


def tokens(picks: list[Pick]) -> list[int]:
    return [p.token for p in picks]


def test_without_a_budget_the_engines_picks_pass_untouched():
    engine = Engine([[11, 12, 11, 12, 11, 12]])
    got, _ = run(engine, 0)
    assert tokens(got) == [11, 12, 11, 12, 11, 12]
    assert engine.calls == [([], cached)]  # one call, with the attempt's own `cached`


def test_at_the_budget_the_close_is_written_and_the_engine_goes_on_after_it():
    engine = Engine([[11, 12, 11, 12, 11, 12], [15, 16]])
    got, out = run(engine, 3)
    assert tokens(got) == [11, 12, 11, 13, 14, 15, 16]
    assert engine.calls == [([], cached), ([11, 12, 11, 13, 14], None)]  # only the first reports the cache
    assert engine.log == ["start", "end after 3", "start", "end after 2"]  # stopped at the budget, then again
    assert out.reasoning_tokens() == 5 and out.open_thinking() is None


def test_the_close_comes_as_picks_without_logprobs():
    engine = Engine([[11, 12, 11], [15]])
    got, _ = run(engine, 2)
    assert got == [Pick(11, -1.0), Pick(12, -1.0), Pick(13), Pick(14), Pick(15, -1.0)]


def test_a_block_the_model_closes_before_its_budget_is_left_alone():
    engine = Engine([[11, 13, 14, 15, 16, 15, 16]])
    got, _ = run(engine, 3)
    assert tokens(got) == [11, 13, 14, 15, 16, 15, 16] and len(engine.calls) == 1


def test_a_reply_that_never_thinks_is_never_closed():
    engine = Engine([[15, 16, 15, 16, 15, 16]])
    got, _ = run(engine, 1, reply=PlainReply())
    assert tokens(got) == [15, 16, 15, 16, 15, 16] and len(engine.calls) == 1


def test_a_continuation_counts_the_earlier_thinking_toward_the_budget():
    engine = Engine([[12, 11, 12], [15]])
    got, _ = run(engine, 3, prior=[11, 12])  # two tokens thought before: one more is the budget
    assert tokens(got) == [12, 13, 14, 15]
    assert [prior for prior, _ in engine.calls] == [[11, 12], [11, 12, 12, 13, 14]]


def test_a_continuation_already_past_its_budget_closes_before_asking_the_engine():
    engine = Engine([[15, 16]])
    got, _ = run(engine, 3, prior=[11, 12, 11, 12])
    assert tokens(got) == [13, 14, 15, 16]
    assert engine.calls == [([11, 12, 11, 12, 13, 14], None)]


class AlwaysThinking(PlainReply):
    """A reply that says it still thinks after the close (as harmony may, opening another
    analysis message)."""

    in_thinking = True
    reasoning_spans = [(0, None)]


def test_the_block_is_closed_once_even_if_the_reply_thinks_on():
    engine = Engine([[11, 12, 11], [12, 11, 12]])
    got, _ = run(engine, 2, reply=AlwaysThinking())
    assert tokens(got) == [11, 12, 13, 14, 12, 11, 12] and len(engine.calls) == 2


def test_closing_the_picks_early_ends_the_engines_own():
    engine = Engine([[11, 12, 11, 12], [15, 16, 15, 16]])
    got, _ = run(engine, 2, stop_after=5)  # the job stops (a stop string, max_tokens) after the close
    assert tokens(got) == [11, 12, 13, 14, 15]
    assert engine.log == ["start", "end after 2", "start", "end after 1"]  # none left running
