"""`POST /v1/rerank` (and `/v2/rerank`, `/rerank`): Cohere's and Jina's reranking, served by a
model's rerank pool."""
