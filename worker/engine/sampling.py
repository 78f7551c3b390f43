"""One sampler per job: each sequence of a batch samples with its own settings.

OpenAI's semantics first, then llama.cpp's extensions, nothing hidden: the job's
`logit_bias`, its frequency and presence penalties over the tokens this completion generated
(a resumed job's earlier tokens included), its `repeat_penalty` over the last 64 of them,
`top_k`, then temperature, `top_p`, `min_p` (both on the tempered distribution, as OpenAI
and vLLM order them; llama-server applies temperature last), and a draw seeded with the
job's seed; temperature 0 is greedy. No sampler is added behind the caller's back.

A greedy job without penalties takes the argmax of its logits row directly (plus its
logit_bias): llama.cpp's chain copies the whole vocabulary into a candidate array on every
call (ten times the argmax, docs/benchmarks.md), and a batch step samples every sequence
before the next decode can start.

A job with a grammar (structured output, tool calls) checks each pick against it and only
masks the vocabulary when the pick is refused (worker/engine/grammar.py). `logprobs` are the model's
own distribution, the log-softmax of the raw logits, before any sampler or grammar, as
llama-server reports them.
"""

from __future__ import annotations

import ctypes
import secrets
from collections.abc import Callable, Iterable, Sequence

import llama_cpp
import numpy as np

from contract.jobspec import JobSpec
from worker.engine.grammar import Candidates, GrammarGate, TriggeredGate
from worker.engine.picks import Pick

REPEAT_LAST_N = 64
_GREEDY_TRIES = 8  # a refused greedy pick: the next best this many before masking everything
_LOGPROB_FLOOR = -9999.0  # OpenAI's value for a token far outside the top


class Sampler:
    """Owns a native sampler chain and grammar, if the job needs them; `close` frees them
    (the scheduler calls it once). `generated`: the tokens earlier attempts published, in
    order, replayed into the penalties and the grammar."""

    def __init__(
        self,
        spec: JobSpec,
        n_vocab: int,
        n_ctx: int,
        generated: Iterable[int] = (),
        gate: GrammarGate | TriggeredGate | None = None,
        is_end: Callable[[int], bool] = lambda token: False,
    ) -> None:
        self._n_vocab = n_vocab
        self._gate = gate
        self._is_end = is_end
        self._top = spec.top_logprobs if spec.logprobs else -1
        self._bias = None
        if spec.logit_bias:
            self._bias = np.zeros(n_vocab, dtype=np.float32)
            for token, bias in spec.logit_bias:
                if token < n_vocab:
                    self._bias[token] = bias
        penalties = bool(spec.frequency_penalty or spec.presence_penalty or spec.repeat_penalty != 1.0)
        self._chain = None
        self._cands: Candidates | None = None
        if spec.temperature > 0 or penalties:
            self._chain = self._build(spec, n_vocab, n_ctx, penalties)
        if gate is not None or (self._chain is not None and self._bias is not None):
            self._cands = Candidates(n_vocab)
        for token in generated:
            if self._chain is not None:
                llama_cpp.llama_sampler_accept(self._chain, token)
            if gate is not None:
                gate.accept(token)  # raises GrammarDeadEnd if the text no longer fits

    def _build(self, spec: JobSpec, n_vocab: int, n_ctx: int, penalties: bool):
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = llama_cpp.llama_sampler_chain_init(params)

        def add(sampler) -> None:
            llama_cpp.llama_sampler_chain_add(chain, sampler)

        if self._bias is not None and self._gate is None:
            biases = (llama_cpp.llama_logit_bias * len(spec.logit_bias))()
            kept = [(t, b) for t, b in spec.logit_bias if t < n_vocab]
            for i, (token, bias) in enumerate(kept):
                biases[i].token, biases[i].bias = token, bias
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(kept), biases))
            self._bias = None  # in the chain
        if penalties:
            if spec.frequency_penalty or spec.presence_penalty:
                add(
                    llama_cpp.llama_sampler_init_penalties(
                        n_vocab, n_ctx, 1.0, spec.frequency_penalty, spec.presence_penalty
                    )
                )
            if spec.repeat_penalty != 1.0:
                add(
                    llama_cpp.llama_sampler_init_penalties(
                        n_vocab, REPEAT_LAST_N, spec.repeat_penalty, 0.0, 0.0
                    )
                )
        if spec.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(spec.top_k))
        if spec.temperature <= 0:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            add(llama_cpp.llama_sampler_init_temp(spec.temperature))
            if spec.top_p < 1.0:
                add(llama_cpp.llama_sampler_init_top_p(spec.top_p, 1))
            if spec.min_p > 0.0:
                add(llama_cpp.llama_sampler_init_min_p(spec.min_p, 1))
            seed = secrets.randbits(32) if spec.seed is None else spec.seed & 0xFFFFFFFF
            add(llama_cpp.llama_sampler_init_dist(seed))
        return chain

    def sample(self, ctx, index: int) -> Pick:
        """Pick from the logits of batch row `index`; the chain and the grammar accept it
        (an end-of-generation token is never fed to the grammar: it ends the job)."""
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(self._n_vocab,))
        logprobs = self._logprobs(row) if self._top >= 0 else None
        if self._chain is None:
            token = self._greedy(row if self._bias is None else row + self._bias)
        elif self._cands is None:
            return self._with(llama_cpp.llama_sampler_sample(self._chain, ctx, index), logprobs)
        else:
            token = self._drawn(row)
            llama_cpp.llama_sampler_accept(self._chain, token)
        if self._gate is not None and not self._is_end(token):
            self._gate.accept(token)  # allowed: it was picked among what the grammar allows
        return self._with(token, logprobs)

    def _greedy(self, row: np.ndarray) -> int:
        token = int(row.argmax())  # the first highest logit, as llama.cpp's greedy sampler picks
        gate = self._gate
        if gate is None or gate.allows(token):
            return token
        best = np.argpartition(row, -_GREEDY_TRIES)[-_GREEDY_TRIES:]
        for t in sorted(best.tolist(), key=lambda t: (-row[t], t)):
            if gate.allows(t):
                return t
        assert self._cands is not None
        self._cands.fill(row)
        gate.mask(self._cands)
        return int(self._cands.a["logit"].argmax())

    def _drawn(self, row: np.ndarray) -> int:
        """The chain's pick over the whole vocabulary; if the grammar refuses it, again over
        what the grammar allows (llama.cpp's rejection sampling)."""
        assert self._cands is not None and self._chain is not None
        biased = row if self._bias is None else row + self._bias
        self._cands.fill(biased)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(self._cands.arr))
        token = self._cands.selected()
        if self._gate is None or self._gate.allows(token):
            return token
        self._cands.fill(biased)
        self._gate.mask(self._cands)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(self._cands.arr))
        return self._cands.selected()

    def _logprobs(self, row: np.ndarray) -> tuple[np.ndarray, float]:
        m = float(row.max())
        return row, m + float(np.log(np.exp(row - m, dtype=np.float64).sum()))

    def _with(self, token: int, logprobs: tuple[np.ndarray, float] | None) -> Pick:
        if logprobs is None:
            return Pick(token)
        row, lse = logprobs
        top: Sequence[int] = ()
        if self._top > 0:
            k = min(self._top, self._n_vocab)
            best = np.argpartition(row, -k)[-k:]
            top = sorted(best.tolist(), key=lambda t: (-row[t], t))
        return Pick(
            token,
            max(float(row[token]) - lse, _LOGPROB_FLOOR),
            tuple((t, max(float(row[t]) - lse, _LOGPROB_FLOOR)) for t in top),
        )

    def close(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None
