"""The host tier wired to a real llama.cpp context (worker/engine/cache/tier.py): a slot's
state saved, restored into another slot, reads on as if it had been read there."""

from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")  # the worker's build (scripts/setup)
from llama_cpp._internals import LlamaModel  # noqa: E402

from contract.stats import BatchCounters  # noqa: E402
from worker.engine.cache.host import HostTier  # noqa: E402
from worker.engine.cache.tier import MIN_TOKENS, HostCache  # noqa: E402
from worker.engine.context import NativeContext, StepBatch  # noqa: E402
from worker.engine.held import HeldPrefixes  # noqa: E402
from worker.settings import default_model_path  # noqa: E402

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")
A, B = "scope-a", "scope-b"
PROMPT = [(7 * i + 3) % 5000 + 100 for i in range(120)]


@pytest.fixture(scope="module")
def context():
    params = llama_cpp.llama_model_default_params()
    model = LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = 2 * 256, 2, False
    params.n_batch = params.n_ubatch = 128
    ctx = llama_cpp.llama_init_from_model(model.model, params)
    yield NativeContext(ctx, model.n_vocab())
    llama_cpp.llama_free(ctx)


def read(context: NativeContext, slot: int, tokens: list[int], start: int = 0) -> np.ndarray:
    """Read `tokens` into `slot` from position `start`: the last one's logits."""
    batch = StepBatch(128)
    n = len(tokens)
    batch.fill(tokens, list(range(start, start + n)), [slot] * n, [i == n - 1 for i in range(n)])
    assert context.decode(batch) == 0
    return context.logits(1)[0].copy()


def test_a_restored_state_reads_on_as_the_slot_that_kept_it(context):
    context.clear()
    host, counters = HostCache(context, HostTier(64 << 20)), BatchCounters()
    read(context, 0, PROMPT)
    host.save(0, PROMPT, A, 0, counters)
    assert counters.host_saved == 1 and counters.host_bytes == host.tier.held > 0
    # a job of A whose prompt extends the first 100 tokens: first in the slot that kept them
    job = [*PROMPT[:100], 11, 12, 13]
    context.remove(0, 100)
    kept = read(context, 0, job[100:], start=100)
    context.remove(0)
    assert host.restore(1, job, B, 0) is None  # another scope restores nothing
    assert host.restore(1, job, A, 0) == PROMPT[:100]  # then in another slot, from host memory
    np.testing.assert_array_equal(read(context, 1, job[100:], start=100), kept)


def test_a_restore_the_slots_already_beat_and_a_short_state_are_skipped(context):
    context.clear()
    host, counters = HostCache(context, HostTier(64 << 20)), BatchCounters()
    read(context, 0, PROMPT)
    host.save(0, PROMPT, A, 0, counters)
    assert host.restore(1, [*PROMPT, 5], A, len(PROMPT)) is None  # a slot holds as much
    host.save(0, PROMPT, A, len(PROMPT) - 2, counters)  # nothing lost but the tail: not saved again
    context.clear()
    read(context, 0, PROMPT[: MIN_TOKENS - 1])
    host.save(0, PROMPT[: MIN_TOKENS - 1], B, 0, counters)  # cheaper read again than kept
    assert counters.host_saved == 1 and len(host.tier) == 1


def test_a_slot_a_queued_copy_touches_is_neither_saved_nor_written(context):
    context.clear()
    host, counters = HostCache(context, HostTier(64 << 20)), BatchCounters()
    read(context, 0, PROMPT)
    host.save(0, PROMPT, A, 0, counters)
    context.copy(0, 1)  # a move: llama.cpp copies at the next decode
    host.save(0, [*PROMPT, 1], B, 0, counters)
    assert counters.host_saved == 1
    assert host.restore(1, [*PROMPT, 9], A, 0) is None


def test_a_saved_state_s_digests_are_announced_until_it_is_cleared(context):
    context.clear()
    held = HeldPrefixes(2)
    owner = object()
    held.taken(0, owner)
    held.held(owner, ["conversation"])
    host, counters = HostCache(context, HostTier(64 << 20), held), BatchCounters()
    read(context, 0, PROMPT)
    host.save(0, PROMPT, A, 0, counters)
    held.taken(0, object())  # the next job writes the slot over
    assert counters.host_saved == 1 and held.digests()[1] == {"conversation"}
    host.clear()
    assert held.digests()[1] == set()
