"""What the model runs on, and what it put where: the devices llama.cpp's backends offer (by
ggml's own device API, which llama-cpp-python does not bind), the layers offloaded and the
KV cache's place and size, said once at start and announced for /metrics.

llama.cpp offloads the last N_GPU_LAYERS of the model's layers (`-1`: all, and the output
layer with them) when a GPU backend is built in, and keeps each offloaded layer's part of the
KV cache beside it (`offload_kqv`, its default): the cache is on the GPU in the share of the
layers offloaded.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class Device:
    name: str  # "CPU", "CUDA0", ...
    description: str  # the CPU's or the GPU's own name
    kind: str  # _KINDS
    free: int  # bytes
    total: int

    @property
    def backend(self) -> str:
        """The backend the device belongs to ("CUDA0" -> "CUDA")."""
        return self.name.rstrip("0123456789") or self.name


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml (the device registry) and libggml-base (the devices), where llama_cpp loads
    its libraries from (its own, or LLAMA_CPP_LIB_PATH's)."""
    lib = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    mode = ctypes.RTLD_GLOBAL
    registry, base = (
        ctypes.CDLL(str(lib / "libggml.so"), mode),
        ctypes.CDLL(str(lib / "libggml-base.so"), mode),
    )
    registry.ggml_backend_dev_count.restype = ctypes.c_size_t
    registry.ggml_backend_dev_get.restype = ctypes.c_void_p
    registry.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(base, name).restype = ctypes.c_char_p
        getattr(base, name).argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_type.restype = ctypes.c_int
    base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return registry, base


def devices() -> list[Device]:
    """Every device of the backends llama.cpp was built with (call after llama_backend_init)."""
    registry, base = _ggml()
    out = []
    for i in range(registry.ggml_backend_dev_count()):
        dev = registry.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            Device(
                base.ggml_backend_dev_name(dev).decode(errors="replace"),
                base.ggml_backend_dev_description(dev).decode(errors="replace").strip(),
                _KINDS.get(base.ggml_backend_dev_type(dev), "?"),
                free.value,
                total.value,
            )
        )
    return out


@dataclass(frozen=True)
class Placement:
    """Where the model and its KV cache are: what the worker says at start and announces."""

    backend: str  # "CUDA", "CPU", ...
    device: str  # its description (a GPU's name, else the CPU's)
    memory: tuple[int, int]  # the device's (free, total) bytes at start
    layers: int  # the model's repeating layers
    gpu_layers: int  # of them, offloaded
    kv_bytes: int  # the whole KV cache (every slot)
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


def placement(model, n_gpu_layers: int, kv_bytes: int, slots: int, n_ctx: int) -> Placement:
    """What llama.cpp did with a loaded model (`model`: a llama_model pointer)."""
    layers = llama_cpp.llama_model_n_layer(model)
    gpus = [d for d in devices() if d.kind in ("GPU", "IGPU")]
    offloaded = 0
    if gpus and llama_cpp.llama_supports_gpu_offload():
        offloaded = layers if n_gpu_layers < 0 else min(n_gpu_layers, layers)
    main = gpus[0] if offloaded else next(iter(devices()), Device("CPU", "CPU", "CPU", 0, 0))
    return Placement(
        main.backend, main.description, (main.free, main.total), layers, offloaded, kv_bytes, slots, n_ctx
    )
