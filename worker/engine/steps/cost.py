"""The time a batch step costs, measured as the worker runs. From it come the prompt tokens a
step may add to the streams that decode (PREFILL_STRETCH). The step planner
(worker.engine.steps.plan.plan) spends them."""

from __future__ import annotations


class StepCost:
    """How many prompt tokens a step may add to the streams that decode.

    The step then takes at most `stretch` times their step alone: measured, not assumed. The
    worker times every step. The time of a decode-only step of `n` streams is a running mean
    per `n`. The allowance is steered after each step that also read a long prompt. It is
    steered by how far that step was from its target. It gets more rows when the step was
    quicker, fewer when it was slower.

    On a CPU each prompt row costs about as much as a decode. Rows cost more as the prompt
    grows. A 3,000-token prompt read 64 tokens a step made 8 streams' steps 12 times longer
    (bench/results/RESULTS.md). On a GPU a row costs little against the pass over the weights.
    There the allowance grows to whole chunks."""

    def __init__(self, stretch: float, start: int = 64) -> None:
        self.stretch = stretch
        # streams decoding -> mean seconds of their step alone
        self._alone: dict[int, float] = {}
        self._allow = float(start)

    def add(self, rows: int, seconds: float, decoding: int = 0, budgeted: bool = False) -> None:
        """A step of `rows`, `decoding` of them streams' tokens. `budgeted`: it read a long
        prompt under `budget`."""
        if decoding and rows == decoding:
            mean = self._alone.get(decoding)
            self._alone[decoding] = seconds if mean is None else 0.9 * mean + 0.1 * seconds
        elif budgeted and (alone := self._alone_for(decoding)) is not None:
            target = self.stretch * alone
            self._allow = min(max(self._allow * min(max(target / seconds, 0.5), 1.5), 1.0), 1e6)

    def _alone_for(self, decoding: int) -> float | None:
        """The step time of `decoding` streams alone, or of the nearest count timed. A stream
        that ends while a long prompt is read leaves a count never timed alone."""
        if not self._alone:
            return None
        return self._alone[min(self._alone, key=lambda n: (abs(n - decoding), n))]

    def budget(self, decoding: int) -> int | None:
        """Prompt tokens a step beside `decoding` streams may read, at least 1. None: no limit.
        That is when no stream decodes, no stretch is set, or no step of streams alone is
        timed yet."""
        if not decoding or not self.stretch or not self._alone:
            return None
        return max(int(self._allow), 1)
