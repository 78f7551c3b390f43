"""A job's grammar, checked token by token: llama.cpp never sees a wrong one.

The grammar sampler of llama.cpp must never accept a token the grammar rejects. It would
abort the whole process. An end-of-generation token before the grammar is complete does the
same. The abort is a C++ exception through the C ABI, or GGML_ABORT. So every token goes
through `allows` before `accept`. `allows` is a one-candidate `llama_sampler_apply`, tens of
microseconds. A token it refuses is a clean `GrammarDeadEnd` for that job, never a dead
worker.

Sampling is llama.cpp's own "sample, then check, then resample" (common_sampler_sample).
The job's sampler chain picks from the whole vocabulary. Only when the grammar refuses that
token does it mask the logits. Then the pick is made again. Masking takes milliseconds over
SmolLM2's 49,152 tokens. Most tokens of a constrained answer pass the check. So a
constrained job costs about what a free one does. Its batch neighbours pay nothing at all.

Control tokens other than the end of generation are banned. The grammar judges a token by
its marker text (`<|im_start|>`). But the published text renders control tokens as nothing.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable

import llama_cpp
import numpy as np

from worker.errors import GrammarDeadEnd

log = logging.getLogger(__name__)

_CANDIDATE = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class BadGrammar(ValueError):
    """llama.cpp could not parse the grammar."""


class Candidates:
    """A candidate array over the whole vocabulary, refilled from a logits row."""

    def __init__(self, n_vocab: int) -> None:
        self.a = np.zeros(n_vocab, dtype=_CANDIDATE)
        self._ids = np.arange(n_vocab, dtype=np.intc)
        self.a["id"] = self._ids
        self.arr = llama_cpp.llama_token_data_array(
            data=self.a.ctypes.data_as(llama_cpp.llama_token_data_p), size=n_vocab, selected=-1, sorted=False
        )

    def fill(self, row: np.ndarray) -> None:
        # a sampler may have reordered them
        self.a["id"] = self._ids
        self.a["logit"] = row
        self.a["p"] = 0.0
        self.arr.size = len(self.a)
        self.arr.selected = -1
        self.arr.sorted = False

    def selected(self) -> int:
        return int(self.a["id"][self.arr.selected])

    def finite(self) -> np.ndarray:
        return np.isfinite(self.a["logit"][: self.arr.size])


class GrammarGate:
    """One job's grammar state.

    Every call happens on one thread at a time. The job thread builds the job's sampler, and
    then only the scheduler thread uses it."""

    def __init__(self, vocab, gbnf: str, banned: Iterable[int]) -> None:
        self._g = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        # a NULL pointer: never add it to anything
        if not self._g:
            raise BadGrammar("llama.cpp could not parse the grammar")
        self._banned = np.array(sorted(set(banned)), dtype=np.intc)
        self._banned_set = frozenset(self._banned.tolist())
        self._one = np.zeros(1, dtype=_CANDIDATE)
        self._one_arr = llama_cpp.llama_token_data_array(
            data=self._one.ctypes.data_as(llama_cpp.llama_token_data_p), size=1, selected=-1, sorted=False
        )

    def allows(self, token: int) -> bool:
        if token in self._banned_set:
            return False
        self._one["id"] = token
        self._one["logit"] = 0.0
        self._one_arr.size = 1
        self._one_arr.selected = -1
        llama_cpp.llama_sampler_apply(self._g, ctypes.byref(self._one_arr))
        return bool(np.isfinite(self._one["logit"][0]))

    def accept(self, token: int) -> None:
        """The only way a token reaches the grammar."""
        if not self.allows(token):
            raise GrammarDeadEnd(f"token {token} does not continue the grammar")
        llama_cpp.llama_sampler_accept(self._g, token)

    def mask(self, cands: Candidates) -> None:
        """Set every token the grammar refuses to -inf; raise if none is left."""
        llama_cpp.llama_sampler_apply(self._g, ctypes.byref(cands.arr))
        if len(self._banned):
            # ids are still in order: apply keeps them
            cands.a["logit"][self._banned] = -np.inf
        if not cands.finite().any():
            raise GrammarDeadEnd("no token continues the grammar")

    def close(self) -> None:
        if self._g:
            llama_cpp.llama_sampler_free(self._g)
            self._g = None


class TriggeredGate:
    """A grammar that applies from the first `trigger` in the generated text on.

    It is for a Hermes call after free text, and works as llama.cpp's lazy grammars do. The
    lazy mode of llama.cpp feeds the triggering text to the grammar unchecked. Text the
    grammar refuses then aborts the process. Here the tokens are replayed through
    `GrammarGate.accept`, which checks each first. The replay starts at the token that holds
    the trigger's first byte. So the grammar must allow what that token holds before the
    trigger. Text that does not fit leaves the job unconstrained, as it was before the
    trigger. So does a grammar llama.cpp cannot parse. Either is logged."""

    def __init__(
        self, make: Callable[[], GrammarGate], trigger: bytes, piece: Callable[[int], bytes]
    ) -> None:
        self._make, self._trigger, self._piece = make, trigger, piece
        # the last tokens, enough to hold a trigger
        self._tail: list[tuple[int, bytes]] = []
        self._gate: GrammarGate | None = None
        self._given_up = False

    def allows(self, token: int) -> bool:
        return self._gate is None or self._gate.allows(token)

    def accept(self, token: int) -> None:
        if self._gate is not None:
            self._gate.accept(token)
            return
        if self._given_up:
            return
        self._tail.append((token, self._piece(token)))
        text = b"".join(p for _, p in self._tail)
        at = text.find(self._trigger)
        if at < 0:
            while self._tail and len(text) - len(self._tail[0][1]) >= len(self._trigger):
                text = text[len(self._tail.pop(0)[1]) :]
            return
        start = 0
        # drop the tokens wholly before the trigger
        while start + len(self._tail[0][1]) <= at:
            start += len(self._tail.pop(0)[1])
        gate = None
        try:
            gate = self._make()
            for t, _ in self._tail:
                gate.accept(t)
        except (GrammarDeadEnd, BadGrammar) as exc:
            log.warning("the text at the trigger does not fit its grammar (%s): left unconstrained", exc)
            if gate is not None:
                gate.close()
            self._given_up = True
            return
        finally:
            self._tail = []
        self._gate = gate

    def mask(self, cands: Candidates) -> None:
        if self._gate is not None:
            self._gate.mask(cands)

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None


def banned_controls(vocab, n_vocab: int) -> list[int]:
    """Control tokens that do not end generation (SmolLM2: `<|im_start|>`, `<file_sep>`, ...)."""
    return [
        t
        for t in range(n_vocab)
        if llama_cpp.llama_vocab_get_attr(vocab, t) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        and not llama_cpp.llama_vocab_is_eog(vocab, t)
    ]
