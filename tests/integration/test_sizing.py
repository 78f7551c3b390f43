"""A worker started with no SLOTS sizes itself (worker/engine/sizing.py) with the real model: as many
slots as its KV budget holds, up to the cap, each with the whole N_CTX, and says so in its log."""

from __future__ import annotations

import logging
import re

import pytest

from worker.engine import model as engine_module
from worker.engine import sizing
from worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

MIB = 1 << 20


def sized(monkeypatch, available: int, **env: str):
    monkeypatch.setattr(sizing, "available_memory", lambda: available)
    base = {"REDIS_URL": "unused", "N_CTX": "512"}
    return engine_module.LlamaEngine(WorkerSettings.from_env({**base, **env}))


def test_slots_come_from_the_kv_budget(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="worker.engine.model")
    buffers = sizing.buffer_bytes(49_152)  # SmolLM2's vocabulary, at 512 rows a pass
    engine = sized(monkeypatch, buffers + 200 * MIB)
    try:
        assert engine._n_vocab == 49_152
        per_slot = engine_module.kv_cache_bytes(engine._model, 512)
        assert engine.slots == (100 * MIB) // per_slot  # half of what is left after the buffers
        assert 1 < engine.slots < sizing.CPU_SLOTS
        assert f"{engine.slots} slots of 512 tokens (from a 100 MiB KV budget" in caplog.text
    finally:
        engine.close()


def test_a_large_budget_stops_at_the_cap_and_a_set_slots_wins(monkeypatch):
    engine = sized(monkeypatch, 64 << 30)
    try:
        assert engine.slots == sizing.CPU_SLOTS
    finally:
        engine.close()
    engine = sized(monkeypatch, 64 << 30, SLOTS="3", KV_MEMORY_SHARE="0.01")
    try:
        assert engine.slots == 3
    finally:
        engine.close()


def test_threads_come_from_the_usable_cores(monkeypatch):
    monkeypatch.setattr(sizing, "usable_cores", lambda: 6)
    engine = sized(monkeypatch, 64 << 30, SLOTS="1")
    try:
        assert engine.threads == sizing.Threads(3, 6)
    finally:
        engine.close()


def test_the_buffers_counted_at_start_are_llama_cpps_compute_buffer(monkeypatch, caplog):
    """A micro-batch's logits are most of the compute buffer llama.cpp logs at start: the
    memory check counts them with the rows a pass, so a larger PREFILL_ALONE is counted."""
    caplog.set_level(logging.DEBUG, logger="llama.cpp")
    for alone, rows in (("64", 64), ("512", 512)):
        caplog.clear()
        engine = sized(monkeypatch, 64 << 30, SLOTS="1", PREFILL_ALONE=alone)
        try:
            logits = sizing.buffer_bytes(engine._n_vocab, rows) - sizing.BUFFER_MARGIN
        finally:
            engine.close()
        logged = [float(m) for m in re.findall(r"CPU compute buffer size = +([\d.]+) MiB", caplog.text)]
        assert logged, caplog.text[-2000:]
        assert logits <= max(logged) * MIB <= logits + 16 * MIB
