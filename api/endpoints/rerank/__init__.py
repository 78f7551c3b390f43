"""`POST /v1/rerank` (and `/v2/rerank`, `/rerank`): Cohere's and Jina's reranking. A model's
rerank pool serves it."""
