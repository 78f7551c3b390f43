"""A batch step. Its sequences are plain data (sequence.py), with the tokens picked for them
(picks.py). What it feeds llama.cpp is in plan.py, and what it costs in cost.py."""
