"""Context edits a job carries (Anthropic's `context_management.edits`): the API checks the
client's edit and enqueues it in plain terms, and the worker, which alone tokenizes, applies it
to the prompt (worker/tools/clearing.py)."""
