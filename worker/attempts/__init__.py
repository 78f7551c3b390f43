"""One attempt at one job: the runner's slots, claims and fencing, the publisher, heartbeats, durability."""
