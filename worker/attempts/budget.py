"""A thinking budget (`JobSpec.thinking_budget`, Anthropic's `thinking.budget_tokens`). A
reasoning model may think that many tokens with its block still open. Then the worker writes
the block's close itself, as if the model had. The model goes on from there with its answer.

The close is tokens of the job like any other. They are published with their ids. So a
continuation after a crash reads them again, and a replay splits the same. The engine's picks
stop, and start again after them: from the prompt, everything generated and the close. The
slot's cache holds all but the close. So only the close is read (worker/engine/steps/plan.py
`prefix_source`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace

from contract.jobspec import JobSpec
from worker.attempts.sender import Sender
from worker.engine.protocol import Engine, Generation
from worker.engine.steps.picks import Pick

Picks = Generator[tuple[Pick, bytes]]


def bounded(engine: Engine, job: Generation, out: Sender) -> Picks:
    """The engine's picks for the job, its thinking closed at the budget. Most jobs have no
    budget. For them these are the engine's own picks, with nothing between."""
    spec = job.spec
    if not spec.thinking_budget:
        return engine.tokens(job)

    # from the prompt, everything generated, and `ids`; the slot's cache is told once
    def picks(ids: list[int]) -> Picks:
        return engine.tokens(replace(job, prior=[*job.prior, *ids], cached=None if ids else job.cached))

    return _closing(spec.thinking_budget, engine, spec, picks, out)


def _closing(
    budget: int, engine: Engine, spec: JobSpec, start: Callable[[list[int]], Picks], out: Sender
) -> Picks:
    """The caller handles each pick before it asks for the next: the sender reads it. So the
    count `due` reads is current."""
    closed = False
    # this attempt's tokens
    ids: list[int] = []

    def due() -> bool:
        thinking = out.open_thinking()
        return not closed and thinking is not None and thinking >= budget

    picks: Picks | None = None
    try:
        while True:
            if due():
                closed = True
                for token in engine.close_thinking(spec):
                    ids.append(token)
                    yield Pick(token), engine.piece(token)
            picks = start(ids)
            for pick, piece in picks:
                yield pick, piece
                ids.append(pick.token)
                if due():
                    break
            else:
                return
            picks.close()
    finally:
        if picks is not None:
            picks.close()
