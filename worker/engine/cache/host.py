"""The host-memory tier of the prompt cache: whole-sequence KV states, as
`llama_state_seq_get_data` serialises them, kept after their slot was written over.

A state is kept under its token-id chain and its cache scope (contract/prefixes.py
`cache_scope`): a job finds only states of its own scope, so no key reads another's (a public
prompt's head is shared in the slots, never through this tier). llama.cpp serialises a
sequence whole, so a state is kept whole: of two states where one extends the other (its
tokens all but the last few, a turn's answer re-tokenized), only the longer is kept; it
restores the shorter's prefix as well. Bounded in bytes, least recently used out first.

Pure Python: the scheduler's thread alone calls it (worker/engine/cache/tier.py), and its
tests need no model (tests/unit/worker/engine/cache/test_host.py).
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from dataclasses import dataclass

from worker.engine.steps.plan import TAIL, common_prefix


@dataclass(eq=False)
class Kept:
    """One sequence's state: its tokens (the cells it holds, in order) and its bytes."""

    scope: str
    tokens: list[int]
    state: mmap.mmap | bytearray  # its bytes (worker/engine/context.py `save`)


class HostTier:
    def __init__(self, bound: int) -> None:
        self.bound = bound  # bytes; 0: nothing is kept
        self.held = 0  # bytes of the states kept
        self.evictions = 0  # states dropped for the bound (not those a longer one replaced)
        self._kept: OrderedDict[int, Kept] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._kept)

    def covered(self, scope: str, tokens: list[int]) -> bool:
        """Whether a kept state of `scope` already holds `tokens` (all but the last few):
        saving them would keep nothing more."""
        return any(k.scope == scope and _extends(k.tokens, tokens) for k in self._kept.values())

    def put(self, scope: str, tokens: list[int], state: mmap.mmap | bytearray) -> bool:
        """Keep a state; False when it is not kept (larger than the bound, or a kept state of
        its scope extends it: that one is used again instead). The states it extends go."""
        if not tokens or len(state) > self.bound:
            return False
        for key, kept in list(self._kept.items()):
            if kept.scope != scope:
                continue
            if _extends(kept.tokens, tokens):
                self._kept.move_to_end(key)
                return False
            if _extends(tokens, kept.tokens):
                self._drop(key)
        entry = Kept(scope, list(tokens), state)
        self._kept[id(entry)] = entry
        self.held += len(state)
        while self.held > self.bound:
            self._drop(next(iter(self._kept)))
            self.evictions += 1
        return True

    def find(self, scope: str, context: list[int]) -> tuple[Kept, int] | None:
        """The kept state of `scope` sharing the longest prefix with `context` (of those, the
        shortest: fewer cells to restore), and how many tokens it shares; it becomes the most
        recently used. None: no state of that scope shares a token."""
        best: tuple[int, int, int] | None = None  # (shared, -cells, key)
        for key, kept in self._kept.items():
            if kept.scope == scope and (shared := common_prefix(kept.tokens, context)):
                candidate = (shared, -len(kept.tokens), key)
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
        if best is None:
            return None
        self._kept.move_to_end(best[2])
        return self._kept[best[2]], best[0]

    def clear(self) -> None:
        self._kept.clear()
        self.held = 0

    def _drop(self, key: int) -> None:
        self.held -= len(self._kept.pop(key).state)


def _extends(longer: list[int], shorter: list[int]) -> bool:
    """`longer` holds `shorter`'s tokens, all but its last TAIL (a turn's answer, rendered
    again in the next turn's prompt, may be tokenized otherwise at its end)."""
    return len(longer) >= len(shorter) and common_prefix(longer, shorter) >= len(shorter) - TAIL
