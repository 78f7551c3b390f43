"""One sampler per job: each sequence of a batch samples with its own settings.

OpenAI's semantics come first, then llama.cpp's extensions, with nothing hidden. First comes
the job's `logit_bias`. Then its frequency and presence penalties, over the tokens this
completion generated. Those include a resumed job's earlier tokens. Then its
`repeat_penalty`, over the last 64 of them. Then `top_k`, then temperature, `top_p` and
`min_p`. Both `top_p` and `min_p` act on the tempered distribution, as OpenAI and vLLM order
them. In llama-server, temperature comes last. The chain ends with a draw seeded with the
job's seed. Temperature 0 is greedy. No sampler is added behind the caller's back.

A greedy job without penalties, grammar or logprobs is a plain row. A step's plain rows take
their argmax together (`pick_rows`), in one pass over the step's logits. First their
logit_bias is added in place, one scatter per distinct bias. `ignore_eos` gives every such
row the same bias. Per row in Python, 64 rows of Llama 3's logits cost milliseconds on top
of that pass. Llama 3 has 128,256 logits a row. All that time the GPU waited for the next step
(bench/step_overhead.py). Other rows pick one by one from their own row of the same array.
Each runs llama.cpp's chain over a candidate array filled from that row, as
`llama_sampler_sample` fills it.

A job with a grammar (structured output, tool calls) checks each pick against it. It masks
the vocabulary only when the pick is refused (worker/engine/grammar.py). `logprobs` are the
model's own distribution: the log-softmax of the raw logits. They come before any sampler or
grammar, as llama-server reports them.
"""

from __future__ import annotations

import ctypes
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence

import llama_cpp
import numpy as np

from contract.jobspec import JobSpec
from worker.engine.grammar import Candidates, GrammarGate, TriggeredGate
from worker.engine.steps.picks import Pick
from worker.errors import GrammarDeadEnd

REPEAT_LAST_N = 64
# a refused greedy pick: the next best this many before masking everything
_GREEDY_TRIES = 8
# OpenAI's value for a token far outside the top
_LOGPROB_FLOOR = -9999.0


class Sampler:
    """Owns a native sampler chain and grammar, if the job needs them.

    `close` frees them, and the scheduler calls it once. `generated` is the tokens earlier
    attempts published, in order. They are replayed into the penalties and the grammar."""

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
        # (token ids, values) added to a row
        self.bias: tuple[np.ndarray, np.ndarray] | None = None
        if spec.logit_bias:
            # the last wins
            kept = {token: bias for token, bias in spec.logit_bias if token < n_vocab}
            ids = np.fromiter(kept, dtype=np.intp, count=len(kept))
            self.bias = ids, np.fromiter(kept.values(), dtype=np.float32, count=len(kept))
        # rows with one bias share its scatter (`pick_rows`)
        self.bias_key = spec.logit_bias
        penalties = bool(spec.frequency_penalty or spec.presence_penalty or spec.repeat_penalty != 1.0)
        self._chain = None
        self._cands: Candidates | None = None
        if spec.temperature > 0 or penalties:
            self._chain = self._build(spec, n_vocab, n_ctx, penalties)
        if gate is not None or self._chain is not None:
            self._cands = Candidates(n_vocab)
        # its pick is its biased row's argmax, taken with the step's other plain rows (`pick_rows`)
        self.plain = self._chain is None and gate is None and self._top < 0
        for token in generated:
            if self._chain is not None:
                llama_cpp.llama_sampler_accept(self._chain, token)
            if gate is not None:
                # raises GrammarDeadEnd if the text no longer fits
                gate.accept(token)

    def _build(self, spec: JobSpec, n_vocab: int, n_ctx: int, penalties: bool):
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        chain = llama_cpp.llama_sampler_chain_init(params)

        def add(sampler) -> None:
            llama_cpp.llama_sampler_chain_add(chain, sampler)

        if self.bias is not None and self._gate is None:
            biases = (llama_cpp.llama_logit_bias * len(spec.logit_bias))()
            kept = [(t, b) for t, b in spec.logit_bias if t < n_vocab]
            for i, (token, bias) in enumerate(kept):
                biases[i].token, biases[i].bias = token, bias
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(kept), biases))
            # in the chain
            self.bias = None
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

    def sample(self, row: np.ndarray) -> Pick:
        """Pick from this job's row of a step's logits. The chain and the grammar accept the pick.

        An end-of-generation token is never fed to the grammar: it ends the job."""
        logprobs = self._logprobs(row) if self._top >= 0 else None
        if self._chain is None:
            token = self._greedy(self._biased(row))
        else:
            token = self._drawn(row)
            llama_cpp.llama_sampler_accept(self._chain, token)
        if self._gate is not None and not self._is_end(token):
            # allowed: it was picked among what the grammar allows
            self._gate.accept(token)
        return self._with(token, logprobs)

    def _biased(self, row: np.ndarray) -> np.ndarray:
        if self.bias is None:
            return row
        ids, values = self.bias
        out = row.copy()
        out[ids] += values
        return out

    def _greedy(self, row: np.ndarray) -> int:
        # the first highest logit, as llama.cpp's greedy sampler picks
        token = int(row.argmax())
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
        """The chain's pick over the whole vocabulary.

        If the grammar refuses it, the chain picks again over what the grammar allows. This is
        llama.cpp's rejection sampling."""
        assert self._cands is not None and self._chain is not None
        biased = self._biased(row)
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


def pick_rows(
    samplers: list[Sampler],
    logits: np.ndarray,
    argmax: Callable[[np.ndarray], list[int]] = lambda rows: rows.argmax(axis=1).tolist(),
) -> list[Pick | GrammarDeadEnd]:
    """Each row's pick, or its job's grammar dead end. Row k of `logits` is `samplers[k]`'s.

    The plain rows' biases are added in place, since nothing else reads their rows. Then their
    argmax is one pass over each run of consecutive plain rows. `argmax` may be a
    worker.engine.argmax.RowsArgmax, which splits a long run over threads."""
    picks: list[Pick | GrammarDeadEnd | None] = [None] * len(samplers)
    plain = [k for k, s in enumerate(samplers) if s.plain]
    biased: dict[tuple, list[int]] = {}
    for k in plain:
        if samplers[k].bias is not None:
            biased.setdefault(samplers[k].bias_key, []).append(k)
    for rows in biased.values():
        ids, values = samplers[rows[0]].bias  # type: ignore[misc]
        logits[np.ix_(rows, ids)] += values
    for start, stop in _runs(plain):
        for k, token in enumerate(argmax(logits[start:stop]), start):
            picks[k] = Pick(token)
    for k, sampler in enumerate(samplers):
        if not sampler.plain:
            try:
                picks[k] = sampler.sample(logits[k])
            # this job's own grammar: the others go on
            except GrammarDeadEnd as exc:
                picks[k] = exc
    return picks  # type: ignore[return-value]


def _runs(rows: list[int]) -> Iterator[tuple[int, int]]:
    """[start, stop) of each run of consecutive numbers in the sorted `rows`."""
    start = prev = None
    for k in rows:
        if start is None:
            start = prev = k
        elif k == prev + 1:
            prev = k
        else:
            yield start, prev + 1
            start = prev = k
    if start is not None:
        yield start, prev + 1
