"""The prompt cache beyond the slots: whole-sequence KV states kept in host memory (host.py)
and how the batching scheduler saves and restores them (tier.py)."""
