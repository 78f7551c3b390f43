"""Context edits a job carries (Anthropic's `context_management.edits`). The API checks the client's
edit and enqueues it in plain terms. The worker alone tokenizes, so it applies the edit to the
prompt (worker/tools/clearing.py)."""
