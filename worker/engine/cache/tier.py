"""The host tier wired to the slots.

The batching scheduler (worker/engine/batching.py) saves a slot's state when the slot's cache
is about to be written over. It restores a kept state into the slot a job takes when the job's
prompt extends that state. The job then reads only the rest.

A state is saved in two cases. A new job takes a slot whose conversation it does not extend.
Then more than the last few tokens would be lost. Or a move between slots writes over an ended
conversation that no spare slot could keep.

A restore copies the kept state's cells into the slot (`llama_state_seq_set_data`). It then
cuts them to the prefix the job shares. On a CPU a cell copies in ~5 us, where a token reads in
~2 ms (SmolLM2 on two cores). On a GPU the state goes host to device over PCIe. That is ~22 KiB
a token for SmolLM2, against a prefill of thousands of tokens a second. So a restore wins for
any prefix longer than a few dozen tokens. Both run on the scheduler's thread, between steps.

A saved state keeps the routing digests its slot held. The worker announces the tier's digests
(worker/engine/held.py `hosted`). So a conversation's next turn is routed to the worker that
can restore it.
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
    """The tier, and the context it saves from and restores into. It runs on the scheduler's thread."""

    def __init__(self, context: NativeContext, tier: HostTier, held: HeldPrefixes | None = None) -> None:
        self._context = context
        self.tier = tier
        # where the tier's digests are announced from, for routing
        self._held = held
        self._announced = tier.version

    def save(self, slot: int, tokens: list[int], scope: str, kept: int, counters: BatchCounters) -> None:
        """Slot `slot` holds `tokens` of `scope`, and is about to keep only its first `kept`.

        Its whole state goes to the tier, with the slot's routing digests. It goes only if
        keeping `kept` loses more than the last few tokens. And no kept state of that scope
        may hold them already."""
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
        """Restore a kept state of `scope` into `slot`, if it holds more of `context` than the slots.

        The slots give `have` tokens. The restore must also be worth the cells it copies (as
        `prefix_source`). Return the tokens the slot now holds. None: nothing done, and the
        slot is as it was."""
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
    """The worker's tier, bounded by HOST_CACHE_MIB or the memory available now.

    The memory available is measured with the weights and the KV cache allocated
    (worker/engine/sizing.py). None when the bound is 0."""
    bound = sizing.host_cache_bytes(mib, sizing.available_memory())
    log.info("host tier of the prompt cache: %.0f MiB (HOST_CACHE_MIB; 0: off)", bound / 2**20)
    return HostCache(context, HostTier(bound), held) if bound else None
