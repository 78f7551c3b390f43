"""What a worker runs on, as plain data.

It holds the devices llama.cpp offers, and where the model and its KV cache went. They are
found by worker/engine/devices.py. The data is plain so that what announces it imports no
llama.cpp (worker/intake/presence.py, worker/attempts/)."""

from __future__ import annotations

from dataclasses import dataclass


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
