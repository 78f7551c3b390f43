"""A model-free engine for load tests of the API and Redis tiers (capacity planning).

It emits a fixed number of tokens per job at a fixed rate and goes through exactly the same
job runner, publisher and stream contract as the real engine; only the token source differs.
Tokens are deterministic (the n-th token of every completion is " w<n>"), so a resumed job
continues exactly where it stopped and tests can check the text.

It cannot be enabled by accident: it needs `ENGINE=synthetic`, it serves only model names
that start with `synthetic` (so it never takes a real model's jobs), and it says so loudly in
the log at start and on every job.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Generator, Sequence

from contract.jobspec import JobSpec
from contract.stats import BatchCounters
from worker.engine.steps.picks import Pick
from worker.errors import PromptTooLong
from worker.text.replies import PlainReply, Reply
from worker.tools import clearing

log = logging.getLogger(__name__)

NAME_PREFIX = "synthetic"
EOS = 0
_FIRST_WORD_ID = 1_000
_MIN_SLEEP_S = 0.001  # a sleep per token would cost more than the token at thousands/s


DEFAULT_SLOTS = 8  # no memory to size it by (worker/engine/sizing.py): load tests set SLOTS


class SyntheticEngine:
    def __init__(
        self,
        model_name: str,
        n_ctx: int,
        tokens_per_job: int,
        rate: float,
        slots: int | None = None,
        load_s: float = 0.0,
    ) -> None:
        if not model_name.startswith(NAME_PREFIX):
            raise SystemExit(
                f"ENGINE=synthetic serves only model names starting with {NAME_PREFIX!r} "
                f"(got MODEL_NAME={model_name!r}), so it can never answer a real model's requests."
            )
        self.model_name = model_name
        self.n_ctx = n_ctx
        self.slots = slots or DEFAULT_SLOTS
        self.tokens_per_job = tokens_per_job
        self.rate = rate  # tokens per second per job; 0 = as fast as the publish path allows
        self.placement = None  # no model: nothing placed anywhere
        self.held = None  # no KV cache: no prefix held
        self.prompt_overhead = None  # no template: the API reserves its most for one
        log.warning(
            "SYNTHETIC ENGINE: model %r answers with %d generated words per job at %s tok/s, "
            "no model is loaded. For load tests only.",
            model_name,
            tokens_per_job,
            rate or "unlimited",
        )
        time.sleep(load_s)  # a model's load, for tests of what happens while a worker starts

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        """Its clear_tool_uses edit applied (worker/tools/clearing.py), words counted as tokens."""
        if spec.kind != "chat" or spec.clear_tool_uses is None:
            return spec, (0, 0)
        before = len(self._ids(spec))
        edited, uses = clearing.clear_tool_uses(spec, before, lambda text: len(_word_ids(text)))
        return edited, (uses, before - len(self._ids(edited)) if uses else 0)

    def _ids(self, spec: JobSpec) -> list[int]:
        """One id per whitespace-separated word (4 more per chat message for its markers)."""
        if spec.kind != "chat":
            return _word_ids(spec.prompt)
        return [i for m in spec.messages for i in (1, 2, 3, 4, *_word_ids(m.content))]

    def prompt_ids(self, spec: JobSpec) -> list[int]:
        ids = self._ids(spec)
        if len(ids) >= self.n_ctx:
            raise PromptTooLong(len(ids), self.n_ctx, "messages" if spec.kind == "chat" else "prompt")
        return ids

    def is_end(self, token: int) -> bool:
        return token == EOS

    def warm_up(self, budget_s: float = 30.0, until: Callable[[], bool] = lambda: False) -> float:
        """Nothing to warm: no model."""
        return 0.0

    def step_ms(self) -> float:
        """No batch steps."""
        return 0.0

    def counters(self) -> BatchCounters:
        """No batching scheduler here: nothing to count."""
        return BatchCounters()

    def reply(self, spec: JobSpec, prompt: list[int]) -> Reply:
        return PlainReply()

    def piece(self, token: int) -> bytes:
        return f" w{token - _FIRST_WORD_ID}".encode() if token >= _FIRST_WORD_ID else b""

    def tokens(
        self,
        spec: JobSpec,
        prompt: Sequence[int],
        prior: Sequence[int],
        progress: Callable[[], None] | None = None,
        alone_for: int = 0,
        cached: Callable[[int], None] | None = None,
        since_ms: int = 0,
    ) -> Generator[tuple[Pick, bytes]]:
        """Words after those earlier attempts generated (a resumed job goes on where it
        stopped), paced from the first one on an absolute schedule, then EOS (with
        `ignore_eos`, words until the caller stops at max_tokens)."""
        log.warning("SYNTHETIC ENGINE answering %s", spec.id)
        position = len(prior)
        wanted = self.n_ctx if spec.ignore_eos else self.tokens_per_job  # no end: until max_tokens
        last = min(wanted, self.n_ctx - len(prompt))  # the window's end
        start = time.monotonic()
        for n, pos in enumerate(range(position, last)):
            if self.rate > 0:
                delay = start + n / self.rate - time.monotonic()
                if delay > _MIN_SLEEP_S:  # at high rates, tokens come in bursts of ~1 ms
                    time.sleep(delay)
            yield Pick(_FIRST_WORD_ID + pos), f" w{pos}".encode()
        if last == wanted and not spec.ignore_eos:
            yield Pick(EOS), b""


def _word_ids(text: str) -> list[int]:
    return [_FIRST_WORD_ID + zlib.crc32(w.encode()) % 50_000 for w in text.split()]
