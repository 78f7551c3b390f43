"""The host tier wired to the slots: what the batching scheduler (worker/engine/batching.py)
saves when a slot's cache is about to be written over, and restores into the slot a job takes
when its prompt extends a kept state, so that the job reads only the rest.

A state is saved when a new job takes a slot whose conversation it does not extend (more than
the last few tokens would be lost), or when a move between slots writes over an ended
conversation that no spare slot could keep. A restore copies the kept state's cells into the
slot (`llama_state_seq_set_data`) and cuts them to the prefix the job shares. On a CPU a cell
copies in ~5 us where a token reads in ~2 ms (SmolLM2 on two cores); on a GPU the state goes
host to device, ~22 KiB a token for SmolLM2 over PCIe, against a prefill of thousands of
tokens a second: a restore wins for any prefix longer than a few dozen tokens. Both run on the
scheduler's thread, between steps.

A saved state keeps the routing digests its slot held, and the worker announces the tier's
(worker/engine/held.py `hosted`): a conversation's next turn is routed to the worker that can
restore it.
"""

from __future__ import annotations

import logging

from contract.stats import BatchCounters
from worker.engine import sizing
from worker.engine.cache.host import HostTier
from worker.engine.context import NativeContext
from worker.engine.held import HeldPrefixes
from worker.engine.steps.plan import COPY_RATIO, TAIL

log = logging.getLogger(__name__)

# a shorter sequence is cheaper to read again than to keep
MIN_TOKENS = 64


class HostCache:
    """The tier and the context it saves from and restores into, on the scheduler's thread."""

    def __init__(self, context: NativeContext, tier: HostTier, held: HeldPrefixes | None = None) -> None:
        self._context = context
        self.tier = tier
        # where the tier's digests are announced from, for routing
        self._held = held
        self._announced = tier.version

    def save(self, slot: int, tokens: list[int], scope: str, kept: int, counters: BatchCounters) -> None:
        """Slot `slot` holds `tokens` of `scope` and is about to keep only its first `kept`
        (of that scope): its whole state goes to the tier if that loses more than the last few
        tokens and no kept state holds them already, with the slot's routing digests."""
        if len(tokens) < MIN_TOKENS or len(tokens) - kept <= TAIL:
            return
        digests = self._held.private(slot) if self._held is not None else ()
        if covering := self.tier.covering(scope, tokens):
            self.tier.routes(covering, digests)
        elif (state := self._context.save(slot)) is not None:
            evictions = self.tier.evictions
            if self.tier.put(scope, list(tokens), state, digests):
                counters.host_saved += 1
            counters.host_evictions += self.tier.evictions - evictions
            counters.host_bytes = self.tier.held
        self._announce()

    def restore(self, slot: int, context: list[int], scope: str, have: int) -> list[int] | None:
        """When a kept state of `scope` holds more of `context` than the `have` tokens the
        slots give (and a restore, by the cells it copies, is worth it: as `prefix_source`),
        restore it into `slot` and return the tokens the slot now holds; None: nothing done
        (the slot as it was)."""
        if self._context.queued(slot) or not (found := self.tier.find(scope, context)):
            return None
        kept, shared = found
        keep = min(shared, len(context) - 1)
        if keep <= have or (keep - have) * COPY_RATIO < len(kept.tokens):
            return None
        if not self._context.restore(slot, kept.state):
            self._context.remove(slot)
            return []
        self._context.remove(slot, keep)
        return kept.tokens[:keep]

    def clear(self) -> None:
        self.tier.clear()
        self._announce()

    def _announce(self) -> None:
        if self._held is not None and self.tier.version != self._announced:
            self._held.hosted(self.tier.digests())
            self._announced = self.tier.version


def sized(context: NativeContext, mib: int | None, held: HeldPrefixes | None = None) -> HostCache | None:
    """The worker's tier, bounded by HOST_CACHE_MIB or the memory available now (the weights
    and the KV cache allocated: worker/engine/sizing.py); None when the bound is 0."""
    bound = sizing.host_cache_bytes(mib, sizing.available_memory())
    log.info("host tier of the prompt cache: %.0f MiB (HOST_CACHE_MIB; 0: off)", bound / 2**20)
    return HostCache(context, HostTier(bound), held) if bound else None
