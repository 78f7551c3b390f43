"""The seam between a worker's attempts and its engine, as plain types.

An attempt hands the engine one `Generation` and reads tokens back (`Engine.tokens`). The
real engines (worker/engine/model.py) and the model-free ones (worker/engine/synthetic.py,
its `ScriptedEngine` for tests) meet the same `Engine` protocol. The engine also says where it
runs: the devices llama.cpp offers, and where the model and its KV cache went
(worker/engine/devices.py finds them). Plain data, so what announces it imports no llama.cpp
(worker/intake/presence.py, worker/attempts/)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.jobspec import JobSpec
from contract.prefixes import PromptOverhead
from contract.stats import BatchCounters
from worker.engine.held import HeldPrefixes
from worker.engine.steps.picks import Pick
from worker.text.replies import Reply


@dataclass(frozen=True)
class Device:
    # "CPU", "CUDA0", ...
    name: str
    # the CPU's or the GPU's own name
    description: str
    # _KINDS
    kind: str
    # bytes
    free: int
    total: int

    @property
    def backend(self) -> str:
        """The backend the device belongs to ("CUDA0" -> "CUDA")."""
        return self.name.rstrip("0123456789") or self.name


@dataclass(frozen=True)
class Placement:
    """Where the model and its KV cache are.

    The worker says it at start, and announces it."""

    # "CUDA", "CPU", ...
    backend: str
    # its description (a GPU's name, else the CPU's)
    device: str
    # the device's (free, total) bytes at start
    memory: tuple[int, int]
    # the model's repeating layers
    layers: int
    # of them, offloaded
    gpu_layers: int
    # the whole KV cache (every slot)
    kv_bytes: int
    slots: int
    n_ctx: int

    @property
    def kv_on_gpu(self) -> int:
        return self.kv_bytes * self.gpu_layers // max(self.layers, 1)

    def describe(self) -> str:
        free, total = self.memory
        gib = 2**30
        host = self.kv_bytes - self.kv_on_gpu
        where = "in host memory"
        if self.gpu_layers:
            where = f"{self.kv_on_gpu / gib:.2f} GiB on the GPU, {host / gib:.2f} GiB in host memory"
        return (
            f"backend {self.backend} on {self.device} ({total / gib:.1f} GiB, {free / gib:.1f} GiB free); "
            f"{self.gpu_layers} of {self.layers} layers offloaded; KV cache {self.kv_bytes / 2**20:.0f} MiB "
            f"({where}); {self.slots} slots x {self.n_ctx} tokens"
        )


@dataclass(frozen=True)
class Generation:
    """One job's generation, as an attempt asks an engine for it.

    The engine samples after `prompt` and `prior` (what earlier attempts generated). A suspect
    steps apart from jobs still reading until it has generated `alone_for` tokens
    (worker/engine/steps/plan.py). A continuation's context is read by how long its stream has
    stalled (`since_ms`, when it last moved, Unix ms). `progress` is called after every step the
    job is part of. Once the tokens' iterator is closed, `cached` is told how many context tokens
    the slot's cache held."""

    spec: JobSpec
    prompt: Sequence[int]
    prior: Sequence[int] = ()
    alone_for: int = 0
    since_ms: int = 0
    progress: Callable[[], None] | None = None
    cached: Callable[[int], None] | None = None


class Engine(Protocol):
    """What a worker needs of the engine it runs jobs on."""

    model_name: str
    n_ctx: int
    # sequences decoded together (SLOTS, or sized at start: worker/engine/sizing.py)
    slots: int
    # where the model and its cache are (None: no model)
    placement: Placement | None
    # the prefixes its slots hold (None: no cache)
    held: HeldPrefixes | None
    # what its chat template adds to a prompt (announced)
    prompt_overhead: PromptOverhead | None

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        """The spec with its context edit applied, and what it cleared: (tool uses, tokens)."""

    def prompt_ids(self, spec: JobSpec) -> list[int]: ...
    def is_end(self, token: int) -> bool: ...
    def piece(self, token: int) -> bytes: ...
    def reply(self, spec: JobSpec, prompt: list[int]) -> Reply: ...

    def close_thinking(self, spec: JobSpec) -> list[int]:
        """The tokens that close its thinking."""

    def tokens(self, job: Generation) -> Generator[tuple[Pick, bytes]]:
        """Sampled tokens with their text, until the caller closes the iterator."""

    def warm_up(self, budget_s: float = 30.0, until: Callable[[], bool] = lambda: False) -> float: ...
    def counters(self) -> BatchCounters: ...
    def step_ms(self) -> float: ...
