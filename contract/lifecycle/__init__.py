"""A job's life, declared once.

`states` holds the states a job and its attempts can be in. It holds each move between them, with
the side that makes it, its Lua scripts and its keys. `glossary` holds the words tokenspool coins
for them, one sentence each. The lifecycle section of docs/protocol.md and docs/glossary.md are
generated from these (`python -m devstack.lifecycle`). A test keeps them in step.
"""
