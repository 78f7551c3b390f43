"""How big a worker is when SLOTS and the thread counts are not set.

Slots. A batched step reads the model's weights once for every sequence in it. So the
tokens/s of a worker grows with the streams it decodes together. A slot left idle costs
nothing but its part of the KV cache. A step holds only the running sequences. So by default
a worker takes as many slots as its memory budget holds. The budget is `KV_MEMORY_SHARE` of
the memory available at start, after the weights are loaded. The count is at most
`CPU_SLOTS` on a CPU, and `GPU_SLOTS` with the model offloaded. There llama.cpp itself says
whether the cache fits. The engine halves the count until the context is created. For
comparison, llama-server's own default is 4 slots sharing one cache. The figures behind these
numbers are in bench/results/RESULTS.md ("Default size").

Threads. llama.cpp's threads spin on their cores. This process may run on only some cores:
its CPU affinity, or a container's CPU quota. `os.cpu_count()` sees neither. More threads
than those cores make every step wait for a thread that is not running. So the counts are
taken from the usable cores. Half of them serve a step of one token. A single stream is
memory-bound, and the job threads need a core of their own. All of them serve prefill and
batched steps. At each barrier of a step the threads spin before they sleep. On a CPU the
worker makes that spin short. Other processes may be busy on the same cores
(docs/operations.md, "Workers sharing cores").
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CPU_SLOTS = 32
# an embedding worker's jobs at once (their inputs share its decodes)
EMBEDDING_SLOTS = 64
GPU_SLOTS = 64
# libgomp's rounds at a barrier before a thread sleeps, on a CPU worker: beside busy processes
# no step took the slow mode that libgomp's 300,000 (and 10,000) fall into; alone, ~4 % fewer
# tokens/s at 16 streams (bench/results/RESULTS.md, "Barrier spin")
CPU_SPINCOUNT = 1_000


@dataclass(frozen=True)
class Threads:
    # a step that decodes one token
    n_threads: int
    # prefill, and steps that decode several sequences' tokens
    n_threads_batch: int


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity, within its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(cores, 1)


def threads(n_threads: int | None, n_threads_batch: int | None, cores: int) -> Threads:
    """The declared counts, each filled from the usable cores where it is not set."""
    return Threads(n_threads or max(cores // 2, 1), n_threads_batch or cores)


def spin_count(declared: int | None, n_gpu_layers: int) -> int | None:
    """GOMP_SPINCOUNT for libgomp: the declared count.

    Else `CPU_SPINCOUNT` for a worker that computes on the CPU. Else None: libgomp's own,
    which the GPU figures were measured with."""
    if declared is not None:
        return declared
    return CPU_SPINCOUNT if n_gpu_layers == 0 else None


def slots_for(kv_per_slot: int, budget: int, cap: int) -> int:
    """As many slots as `budget` bytes of KV cache hold. At least 1, at most `cap`."""
    return max(1, min(cap, budget // max(kv_per_slot, 1)))


def halvings(start: int) -> list[int]:
    """`start`, then half of it, down to 1. These are the slot counts tried on a GPU."""
    out = [start]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


# HOST_CACHE_MIB unset: a quarter of the memory available
HOST_CACHE_SHARE = 4
# and at most llama-server's own default (`--cache-ram 8192`)
HOST_CACHE_CAP = 8 << 30


def host_cache_bytes(mib: int | None, available: int) -> int:
    """The host tier's bound (worker/engine/cache/): HOST_CACHE_MIB, else a capped share.

    The share is of the memory available once the weights and the KV cache are allocated. The
    tier fills only as conversations leave the slots. So the share leaves room for the job
    threads and others."""
    if mib is not None:
        return mib << 20
    return min(available // HOST_CACHE_SHARE, HOST_CACHE_CAP)


def available_memory() -> int:
    """What this process may still allocate.

    That is the smaller of the cgroup's limit (a container's) and the machine's available
    memory."""
    avail = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    limits = [avail] if avail is not None else []
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if raw != "max":
            limits.append(int(raw) - used)
    except (OSError, ValueError):
        pass
    return min(limits) if limits else 1 << 62


# What a context needs in host memory beside the weights, checked at start: its KV cache and
# llama.cpp's compute buffer. The buffer's largest part is one micro-batch's logits, `n_ubatch`
# rows of the vocabulary in floats: llama.cpp logs 12, 49 and 98 MiB for SmolLM2 (49,152
# tokens) at 64, 256 and 512 rows, and a 128k vocabulary at 512 rows needs 251 MiB. The rest
# of the buffers and the process itself get a fixed margin.
# llama.cpp's default micro-batch: a step's rows in one pass up to it
MAX_UBATCH = 512
BUFFER_MARGIN = 256 << 20
_LOGIT_BYTES = 4


def buffer_bytes(n_vocab: int, n_ubatch: int = MAX_UBATCH) -> int:
    """The compute buffer of a context reading `n_ubatch` rows a pass, with the margin."""
    return BUFFER_MARGIN + n_ubatch * n_vocab * _LOGIT_BYTES


def shortfall(kv: int, buffers: int, weights: int, what: str) -> str | None:
    """Why a context cannot fit in the memory available now, said before llama.cpp allocates it.

    The context has `kv` bytes of cache and `buffers` of compute buffer. None: it fits."""
    have = available_memory()
    mib = 1 << 20
    sizes = (kv / mib, buffers / mib, have / mib)
    log.info("KV cache for %s: %.0f MiB, buffers %.0f MiB (%.0f MiB available)", what, *sizes)
    if kv + buffers <= have:
        return None
    return (
        f"{what} needs a {kv / mib:.0f} MiB KV cache (+{buffers / mib:.0f} MiB of buffers) "
        f"besides the {weights / mib:.0f} MiB model, but only {have / mib:.0f} MiB is "
        "available: lower SLOTS or N_CTX"
    )
