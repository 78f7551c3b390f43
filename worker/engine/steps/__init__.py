"""A batch step: what it feeds llama.cpp (plan.py) and what it costs (cost.py)."""
