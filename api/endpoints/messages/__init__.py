"""Anthropic's Messages API (`POST /v1/messages`) on the same jobs as the other endpoints."""
