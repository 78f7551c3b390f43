"""Relaying a job's stream to its client: the shared reader, the relay, SSE framing, the event cursor."""
