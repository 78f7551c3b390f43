"""What the model runs on, and what it put where.

It lists the devices llama.cpp's backends offer. It also finds the layers offloaded, and the
KV cache's place and size. It reads them by ggml's own device API, which llama-cpp-python
does not bind. They are said once at start and announced for /metrics.

With a GPU backend built in, llama.cpp offloads the last N_GPU_LAYERS of the model's layers.
`-1` offloads all of them, and the output layer with them. Each offloaded layer keeps its
part of the KV cache beside it (`offload_kqv`, the default). So the cache is on the GPU in
the share of the layers offloaded.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from worker.engine.protocol import Device, Placement

# enum ggml_backend_dev_type
_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


def _ggml() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libggml (the device registry) and libggml-base (the devices).

    They are loaded from where llama_cpp loads its libraries: its own, or LLAMA_CPP_LIB_PATH's."""
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
    """Every device of the backends llama.cpp was built with.

    Call it after llama_backend_init."""
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
