"""The tokenspool API: OpenAI-compatible HTTP in front of the RQ queue and the job streams.

It validates and enqueues, then relays a job's Redis stream as Server-Sent Events. It never
imports llama-cpp-python. All it knows of a worker is the Redis contract in `contract`.
"""
