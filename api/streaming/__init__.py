"""Relaying a job's stream to its client. Its parts: the shared reader, relay, SSE framing, event cursor."""
