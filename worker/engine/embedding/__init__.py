"""Embedding workers: a model in an embeddings context, many requests' inputs per decode."""
