"""The worker's line to Redis, and riding out its outages and failovers."""
