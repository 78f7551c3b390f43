"""The host-memory tier of the prompt cache.

It keeps whole-sequence KV states after their slot was written over. A state is kept as
`llama_state_seq_get_data` serialises it.

A state is kept under its token-id chain and its cache scope (contract/prefixes.py
`cache_scope`). A job finds only states of its own scope, so no key reads another's. A public
prompt's head is shared in the slots, never through this tier.

A state is kept whole, since llama.cpp serialises a sequence whole. Of two states where one
extends the other, only the longer is kept. It restores the shorter's prefix as well. A state
extends another when it holds the other's tokens, all but the last few (as for a turn's
answer re-tokenized). The tier is bounded in bytes, least recently used out first.

Each state keeps the routing digests its slot held (contract/prefixes.py). The worker
announces them while the state is kept (worker/engine/held.py). It announces at most
MAX_HOST_DIGESTS, of the most recently used states.

Pure Python: only the scheduler's thread calls it (worker/engine/cache/tier.py). Its tests
need no model (tests/unit/worker/engine/cache/test_host.py).
"""

from __future__ import annotations

import mmap
from collections import OrderedDict
from dataclasses import dataclass

from worker.engine.steps.plan import TAIL, common_prefix

# what the tier's states announce for routing, most recent first
MAX_HOST_DIGESTS = 4096


@dataclass(eq=False)
class Kept:
    """One sequence's state: its tokens and its bytes. Its tokens are the cells it holds, in order."""

    scope: str
    tokens: list[int]
    # its bytes (worker/engine/context.py `save`)
    state: mmap.mmap | bytearray
    # the routing digests of the prefixes it restores
    digests: tuple[str, ...] = ()


class HostTier:
    def __init__(self, bound: int) -> None:
        # bytes; 0: nothing is kept
        self.bound = bound
        # bytes of the states kept
        self.held = 0
        # states dropped for the bound (not those a longer one replaced)
        self.evictions = 0
        # bumped when the states kept, and so their digests, change
        self.version = 0
        # least recently used first
        self._kept: OrderedDict[int, Kept] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def covering(self, scope: str, tokens: list[int]) -> Kept | None:
        """The kept state of `scope` that already holds `tokens`, all but the last few.
        Saving them would keep nothing more. None: none does."""
        return next((k for k in self._kept.values() if k.scope == scope and _extends(k.tokens, tokens)), None)

    def routes(self, kept: Kept, digests: tuple[str, ...]) -> None:
        """`kept` restores the prefixes of `digests` too."""
        if not set(digests) <= set(kept.digests):
            kept.digests = _union(kept.digests, digests)
            self.version += 1

    def put(
        self, scope: str, tokens: list[int], state: mmap.mmap | bytearray, digests: tuple[str, ...] = ()
    ) -> bool:
        """Keep a state, or return False when it is not kept.

        It is not kept when it is larger than the bound. Nor is it kept when a kept state of its
        scope extends it. That kept state is then used again instead, and restores `digests` too.
        The states the new one extends go, and it keeps their digests."""
        if not tokens or len(state) > self.bound:
            return False
        for key, kept in list(self._kept.items()):
            if kept.scope != scope:
                continue
            if _extends(kept.tokens, tokens):
                self._kept.move_to_end(key)
                self.routes(kept, digests)
                return False
            if _extends(tokens, kept.tokens):
                digests = _union(kept.digests, digests)
                self._drop(key)
        entry = Kept(scope, list(tokens), state, digests)
        self._kept[id(entry)] = entry
        self.held += len(state)
        self.version += 1
        while self.held > self.bound:
            self._drop(next(iter(self._kept)))
            self.evictions += 1
        return True

    def find(self, scope: str, context: list[int]) -> tuple[Kept, int] | None:
        """The kept state of `scope` sharing the longest prefix with `context`, and how many
        tokens it shares. Of those states it takes the shortest: fewer cells to restore. The
        state becomes the most recently used. None: no state of that scope shares a token."""
        # (shared, -cells, key)
        best: tuple[int, int, int] | None = None
        for key, kept in self._kept.items():
            if kept.scope == scope and (shared := common_prefix(kept.tokens, context)):
                candidate = (shared, -len(kept.tokens), key)
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
        if best is None:
            return None
        self._kept.move_to_end(best[2])
        return self._kept[best[2]], best[0]

    def digests(self) -> frozenset[str]:
        """The routing digests of the states kept, at most MAX_HOST_DIGESTS. The most recently
        used states' digests come first."""
        out: set[str] = set()
        for kept in reversed(self._kept.values()):
            if len(out) + len(kept.digests) > MAX_HOST_DIGESTS:
                break
            out.update(kept.digests)
        return frozenset(out)

    def clear(self) -> None:
        self._kept.clear()
        self.held = 0
        self.version += 1

    def _drop(self, key: int) -> None:
        self.held -= len(self._kept.pop(key).state)
        self.version += 1


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*a, *b)))


def _extends(longer: list[int], shorter: list[int]) -> bool:
    """`longer` holds `shorter`'s tokens, all but its last TAIL. A turn's answer, rendered
    again in the next turn's prompt, may be tokenized otherwise at its end."""
    return len(longer) >= len(shorter) and common_prefix(longer, shorter) >= len(shorter) - TAIL
