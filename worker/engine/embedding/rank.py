"""The rerank engine: a cross-encoder (a GGUF of rank pooling) in the embedding engine's
context.

Its pooled output per sequence is the model's relevance score for one (query, document) pair.
Pairs are sequences as embedding inputs are. The pairs of every job the worker runs share each
decode. The keys that sent them take turns (packing.py).

A score is the head's first output, as llama-server's. A Qwen3 reranker's head ends in a
softmax (llama.cpp's graph). So its score, P(yes), is given as its log-odds. The sigmoid the
API applies gives llama-server's score back.

A pair is rendered as llama-server renders it (tools/server `format_prompt_rerank`). When its
GGUF has a `rerank` template, that is the model's template with `{query}` and `{document}`
filled in. Else it is `BOS query EOS SEP document EOS`. Each special token goes where the
vocabulary says to add it. The template's own text is tokenized with its special tokens. The
query's and the document's are tokenized as plain text. Here, unlike in llama-server (which
parses them too), a document cannot write a control token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import llama_cpp
import numpy as np

from contract import errors
from contract.jobspec import JobSpec
from contract.prefixes import PromptOverhead
from contract.tiers import rank_pool
from worker.engine.embedding.engine import EmbeddingEngine
from worker.engine.embedding.pooling import meta
from worker.errors import PromptRejected
from worker.settings import WorkerSettings

QUERY, DOCUMENT = "{query}", "{document}"
# llama.cpp ends their head in a softmax
SOFTMAX_HEADS = frozenset({"qwen3", "qwen3vl"})
# a probability is kept this far from 0 and 1: its log-odds stay finite
_EPS = 1e-7


def log_odds(p: float) -> float:
    """The score whose sigmoid is `p`. A head that ends in a softmax over (yes, no) gives
    P(yes). Its log-odds is the difference of the two logits."""
    q = min(max(p, _EPS), 1 - _EPS)
    return math.log(q / (1 - q))


@dataclass(frozen=True)
class Frame:
    """A pair's tokens around its query's and its document's: `head query middle document
    tail`."""

    head: list[int]
    middle: list[int]
    tail: list[int]

    def pair(self, query: list[int], document: list[int]) -> list[int]:
        return self.head + query + self.middle + document + self.tail


class PairTooLong(PromptRejected):
    """A pair longer than the model reads at once. RERANK_TRUNCATE is off, or the query alone is too long."""

    error = errors.CONTEXT_LENGTH

    def __init__(self, tokens: int, n_ctx: int, param: str) -> None:
        what = "the query with its document" if param != "query" else "the query alone"
        super().__init__(
            f"Invalid '{param}': {what} is {tokens} tokens long; this model reads at most {n_ctx} "
            "tokens per pair.",
            param,
        )


def special_frame(vocab: llama_cpp.llama_vocab_p) -> Frame:
    """`BOS query EOS SEP document EOS`, as llama-server frames a pair without a template.
    Each token goes where the vocabulary adds it. EOS is its SEP if it has no EOS."""
    eos = llama_cpp.llama_vocab_eos(vocab)
    if eos == llama_cpp.LLAMA_TOKEN_NULL:
        eos = llama_cpp.llama_vocab_sep(vocab)
    add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
    head = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    middle = [eos] if add_eos else []
    if llama_cpp.llama_vocab_get_add_sep(vocab):
        middle.append(llama_cpp.llama_vocab_sep(vocab))
    return Frame(head, middle, [eos] if add_eos else [])


class RankEngine(EmbeddingEngine):
    """What the runner needs of an engine, for rank jobs.

    `model_name` is the model's rerank pool (contract.tiers.rank_pool). A job's inputs are its
    query then its documents. Its answer is one raw score per document (`Finished.vectors`, one
    float each)."""

    pool = staticmethod(rank_pool)

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings, "rank")
        self.truncate = settings.rerank_truncate
        self.softmax = meta(self._model.model, "general.architecture") in SOFTMAX_HEADS
        self.frame = self._frame()
        # what the frame adds to a pair: the API reserves it per document (api/endpoints/rerank)
        self.prompt_overhead = PromptOverhead(0, len(self.frame.pair([], [])))

    def outputs(self, model: llama_cpp.llama_model_p) -> int:
        """The classifier's labels: its first is the relevance score (llama-server's `embd[0]`)."""
        return max(1, llama_cpp.llama_model_n_cls_out(model))

    def finish(self, vector: np.ndarray, dimensions: int) -> np.ndarray:
        """The score: the head's first label. A probability (a softmax head's) is given as its
        log-odds. So every model's score is one whose sigmoid is its relevance."""
        score = float(vector[0])
        return np.array([log_odds(score) if self.softmax else score], dtype="<f4")

    def _frame(self) -> Frame:
        raw = llama_cpp.llama_model_chat_template(self._model.model, b"rerank")
        if not raw:
            return special_frame(llama_cpp.llama_model_get_vocab(self._model.model))
        template = raw.decode()
        if QUERY not in template or DOCUMENT not in template:
            raise SystemExit("the GGUF's rerank template names no {query} or no {document}")
        head, rest = template.split(QUERY, 1)
        middle, tail = rest.split(DOCUMENT, 1)
        return Frame(*(self._tokens(part, special=True) for part in (head, middle, tail)))

    def _tokens(self, text: str, special: bool = False) -> list[int]:
        return self._model.tokenize(text.encode(), add_bos=False, special=special) if text else []

    def input_ids(self, spec: JobSpec) -> list[list[int]]:
        """Each document's pair with the query. Raises PromptRejected naming the part that
        does not fit. With RERANK_TRUNCATE, a document is cut from its end to fit."""
        if spec.kind != "rank":
            raise PromptRejected(f"{self.model_name} serves reranking only.", "model")
        query, *documents = spec.inputs
        assert isinstance(query, str)
        frame = self.frame
        q = self._tokens(query)
        fixed = len(frame.pair(q, []))
        if fixed >= self.n_ctx:
            raise PairTooLong(fixed, self.n_ctx, "query")
        out = []
        for i, document in enumerate(documents):
            assert isinstance(document, str)
            d = self._tokens(document)
            if fixed + len(d) > self.n_ctx:
                if not self.truncate:
                    raise PairTooLong(fixed + len(d), self.n_ctx, f"documents[{i}]")
                d = d[: self.n_ctx - fixed]
            out.append(frame.pair(q, d))
        return out
