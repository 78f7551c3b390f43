"""`POST /v1/embeddings`: OpenAI's embeddings, served by a model's embedding pool."""
