"""What a context needs in host memory beside the model's weights, checked at start.

Two parts: the KV cache (SLOTS x N_CTX positions), and llama.cpp's compute buffer. The compute
buffer's largest part is one micro-batch's logits, `n_ubatch` rows of the vocabulary in floats:
llama.cpp logs 12, 49 and 98 MiB for SmolLM2 (49,152 tokens) at 64, 256 and 512 rows, and a
128k vocabulary at 512 rows needs 251 MiB. The rest of the buffers and the process itself get
a fixed margin.
"""

from __future__ import annotations

import logging

import llama_cpp
from llama_cpp._internals import LlamaModel

from worker.engine import sizing

MAX_UBATCH = 512  # llama.cpp's default micro-batch: a step's rows in one pass up to it
MARGIN = 256 << 20  # llama.cpp's other buffers and the process itself
_KV_BYTES = 2  # f16 keys and values
_LOGIT_BYTES = 4

log = logging.getLogger(__name__)


def kv_cache_bytes(model: LlamaModel, tokens: int) -> int:
    """Keys and values of every layer for `tokens` positions (f16, as llama.cpp allocates)."""
    m = model.model
    head_dim = llama_cpp.llama_model_n_embd(m) // llama_cpp.llama_model_n_head(m)
    per_token = llama_cpp.llama_model_n_layer(m) * 2 * llama_cpp.llama_model_n_head_kv(m) * head_dim
    return per_token * _KV_BYTES * tokens


def buffer_bytes(n_vocab: int, n_ubatch: int = MAX_UBATCH) -> int:
    """The compute buffer of a context reading `n_ubatch` rows a pass, with the margin."""
    return MARGIN + n_ubatch * n_vocab * _LOGIT_BYTES


def shortfall(kv: int, buffers: int, weights: int, what: str) -> str | None:
    """Why a context of `kv` bytes of cache and `buffers` of compute buffer cannot fit in the
    memory available now (None: it fits), said before llama.cpp allocates it."""
    have = sizing.available_memory()
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
