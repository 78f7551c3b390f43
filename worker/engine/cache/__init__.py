"""The prompt cache beyond the slots. It keeps whole-sequence KV states in host memory (host.py).
The batching scheduler saves and restores them (tier.py)."""
