"""A batch step: its sequences as plain data (sequence.py) and the tokens picked for them
(picks.py), what it feeds llama.cpp (plan.py) and what it costs (cost.py)."""
