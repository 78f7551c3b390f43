"""Starts the whole stack as real processes on loopback: a Redis server, workers, the API.

Used by the local run (`python -m devstack`) and by the integration tests, which kill these
processes to prove recovery. Nothing here is used in production.
"""
