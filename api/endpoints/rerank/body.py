"""A rerank request, as Cohere's SDKs (v1 and v2), Jina's API, vLLM and llama-server take it.

It has a `query`, its `documents` (strings, or objects with a `text`), `top_n` and
`return_documents`.

Everything checked here is refused before anything is enqueued. A pair's length in tokens is
the worker's to count: the API holds no tokenizer. A pair too long is a 400 naming its
document."""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, PrivateAttr

from api.endpoints.body import Body, PositiveInt
from api.http.parsing import Strict, too_many, unsupported
from api.settings import Limits
from contract import keys
from contract.jobspec import JobSpec
from contract.tiers import rank_pool

Text = Annotated[str, Field(min_length=1)]


class Document(Strict):
    """A document as an object (Cohere v1's and Jina's). Its `text` is what is ranked."""

    text: Text


class RerankRequest(Body):
    query: Text
    documents: Annotated[list[Text | Document], Field(min_length=1)]
    top_n: PositiveInt | None = None
    return_documents: bool | None = None
    # Cohere v1's: only the one field a document has here
    rank_fields: list[str] | None = None
    # Cohere's cuts (v2's tokens, v1's chunks): not done here, refused when set (RERANK_TRUNCATE)
    max_tokens_per_doc: int | None = None
    max_chunks_per_doc: int | None = None
    # Cohere v2's request priority (0 to 999): accepted, changes nothing (`service_tier` does)
    cohere_priority: Annotated[int | None, Field(alias="priority", ge=0, le=999)] = None
    # what a completion's body has and a rerank's has not
    stream: None = None  # type: ignore[assignment]
    background: None = None  # type: ignore[assignment]
    cache_salt: None = None  # type: ignore[assignment]
    metadata: None = None  # type: ignore[assignment]
    store: None = None  # type: ignore[assignment]
    user: None = None  # type: ignore[assignment]

    # RERANK_RAW_SCORES, as `to_spec` was told
    _raw_scores: bool = PrivateAttr(default=False)

    @property
    def pool(self) -> str:
        return rank_pool(self.model)

    def texts(self) -> list[str]:
        """Each document's text, in order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def to_spec(self, job_id: str, limits: Limits) -> JobSpec:
        """The job, noting for `job_fields` which scores its answer gives (RERANK_RAW_SCORES). A job
        keeps the scores the API gave when it was made."""
        self._raw_scores = limits.rerank_raw_scores
        return JobSpec(
            id=job_id,
            kind="rank",
            model=self.pool,
            inputs=(self.query, *self.texts()),
            max_tokens=0,
            priority=self.priority,
        )

    def job_fields(self, job_id: str) -> dict[str, str]:
        """What the answer says or keeps beside the scores. That is the model as asked, `top_n`, and
        the documents' texts when asked back. It also keeps which scores it gives: the sigmoid's or
        the raw ones."""
        n = len(self.documents)
        echo = {
            "model": self.model,
            # more than there are: all (Cohere's, vLLM's)
            "top_n": min(self.top_n or n, n),
            "documents": self.texts() if self.return_documents else None,
            "raw_scores": self._raw_scores,
        }
        return {keys.JobField.ECHO: json.dumps(echo)}

    def prompt_chars(self) -> tuple[int, str]:
        """Every pair's characters: the query is read once per document. MAX_PROMPT_CHARS bounds the
        request's work, not its bytes."""
        texts = self.texts()
        return len(self.query) * len(texts) + sum(map(len, texts)), "documents"

    def context_chars(self) -> tuple[int, str]:
        """The longest pair's. Each document is read with the query in a context of its own."""
        texts = self.texts()
        longest = max(range(len(texts)), key=lambda i: len(texts[i]))
        return len(self.query) + len(texts[longest]), f"documents[{longest}]"

    def wanted_tokens(self) -> tuple[int | None, str]:
        return None, "max_tokens"

    def enforce(self, limits: Limits) -> None:
        super().enforce(limits)
        n = len(self.documents)
        if n > limits.max_rerank_documents:
            raise too_many("documents", limits.max_rerank_documents, n)
        if self.rank_fields is not None and self.rank_fields != ["text"]:
            raise unsupported("rank_fields", "A document is ranked by its 'text' alone here.")
        for param in ("max_tokens_per_doc", "max_chunks_per_doc"):
            if getattr(self, param) is not None:
                raise unsupported(
                    param,
                    "Documents are not cut per request here: a pair over the model's context is a "
                    "400, or cut to fit where the workers run with RERANK_TRUNCATE.",
                )
