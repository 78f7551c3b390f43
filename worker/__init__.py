"""The tokenspool worker: loads one model, takes its jobs from RQ, publishes their streams."""
