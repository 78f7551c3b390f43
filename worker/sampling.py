"""One llama.cpp sampler chain per job: each sequence of a batch samples with its own settings.

OpenAI's semantics, nothing hidden: frequency and presence penalties over the tokens this
completion generated (a resumed job's earlier tokens included), then temperature, then top_p,
then a draw seeded with the job's seed; temperature 0 is greedy. No top-k, min-p or repeat
penalty is added behind the caller's back.

A greedy job without penalties takes the argmax of its logits row directly: llama.cpp's
chain copies the whole vocabulary into a candidate array on every call (ten times the
argmax, docs/benchmarks.md), and a batch step samples every sequence before
the next decode can start.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import llama_cpp
import numpy as np

from contract.jobspec import JobSpec


class Sampler:
    """Owns a native sampler chain, if the job needs one; `close` frees it (the scheduler
    calls it once)."""

    def __init__(self, spec: JobSpec, n_vocab: int, n_ctx: int, generated: Iterable[int] = ()) -> None:
        self._n_vocab = n_vocab
        penalties = bool(spec.frequency_penalty or spec.presence_penalty)
        self._chain = None
        if spec.temperature <= 0 and not penalties:
            return  # argmax: no chain (see the module docstring)
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(params)
        if penalties:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, n_ctx, 1.0, spec.frequency_penalty, spec.presence_penalty
                )
            )
        if spec.temperature <= 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
        else:
            self._add(llama_cpp.llama_sampler_init_temp(spec.temperature))
            if spec.top_p < 1.0:
                self._add(llama_cpp.llama_sampler_init_top_p(spec.top_p, 1))
            seed = secrets.randbits(32) if spec.seed is None else spec.seed & 0xFFFFFFFF
            self._add(llama_cpp.llama_sampler_init_dist(seed))
        for token in generated:  # penalties count what earlier attempts generated
            llama_cpp.llama_sampler_accept(self._chain, token)

    def _add(self, sampler) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx, index: int) -> int:
        """Sample from the logits of batch row `index` (the chain accepts the token)."""
        if self._chain is None:  # the first highest logit, as llama.cpp's greedy sampler picks
            row = llama_cpp.llama_get_logits_ith(ctx, index)
            return int(np.ctypeslib.as_array(row, shape=(self._n_vocab,)).argmax())
        return llama_cpp.llama_sampler_sample(self._chain, ctx, index)

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
