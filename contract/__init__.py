"""The Redis contract shared by the API and the workers.

Everything one side writes and the other reads is defined here and only here: key names
(`keys`), job tiers and queue names (`tiers`), the job description the API enqueues
(`jobspec`), the stream entry format (`entries`), every Lua script, which makes writes
atomic and fenced (`lua/`), enqueueing (`queueing`), the error catalogue (`errors`), the
settings both sides share (`settings`), the log format (`logs`), the two Redis roles and
following a failover (`servers`, `failover`), cluster counters (`stats`), prompt prefix
digests (`prefixes`), a job's life and the glossary (`lifecycle/`), JSON schemas as
grammars (`schema`, `gbnf`), custom tools' Lark and regex grammars (`freeform/`), and traces'
propagation format and SDK setup (`tracing/`).
Neither side may build a key, an entry or an error by hand. This package imports only the
standard library, redis and rq (and OpenTelemetry, only when tracing is on:
`tracing/otel.py`), so the API never pulls in llama-cpp-python through it.
"""
