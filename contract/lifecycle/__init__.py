"""A job's life, declared once: the states a job and its attempts can be in, and each move
between them with the side that makes it, its Lua scripts and its keys (`states`); and the
words tokenspool coins for them, one sentence each (`glossary`). docs/protocol.md's
lifecycle section and docs/glossary.md are generated from these (`python -m
devstack.lifecycle`), and a test keeps them in step.
"""
