"""The pooling a GGUF declares. An embedding model's file says how its token vectors become
one (`<architecture>.pooling_type`). A chat model's says nothing."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from worker.engine import llama_log

DECLARED = {
    llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls",
    llama_cpp.LLAMA_POOLING_TYPE_LAST: "last",
    # a reranker's (worker/engine/embedding/rank.py)
    llama_cpp.LLAMA_POOLING_TYPE_RANK: "rank",
}


def declared_pooling(path: Path) -> str:
    """ "mean", "cls", "last" or "rank" (a reranker), as the GGUF declares. "" when it
    declares none, or no pooling at all. It reads the metadata only (a vocabulary-only load),
    not the weights."""
    llama_log.install()
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not read {path}")
    try:
        arch = meta(model, "general.architecture")
        raw = meta(model, f"{arch}.pooling_type")
    finally:
        llama_cpp.llama_model_free(model)
    if not raw:
        return ""
    return DECLARED.get(int(raw), "")


def meta(model: llama_cpp.llama_model_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""
