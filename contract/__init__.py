"""The Redis contract shared by the API and the workers.

Everything one side writes and the other reads is defined here and only here. `keys` names the
keys, and `tiers` the job tiers and queues. `jobspec` is the job description the API enqueues.
`entries` is the stream entry format. `lua/` holds every Lua script: they make writes atomic and
fenced. `queueing` enqueues, and `errors` is the error catalogue. `settings` holds the settings
both sides share, and `logs` the log format. `servers` holds the two Redis roles, and `failover`
follows a primary through a failover. `stats` holds cluster counters, and `prefixes` prompt
prefix digests. `lifecycle/` is a job's life and the glossary. `schema` and `gbnf` turn JSON
schemas into grammars. `freeform/` holds custom tools' Lark and regex grammars. `tracing/`
holds traces' propagation format and SDK setup.
Neither side may build a key, an entry or an error by hand. This package imports only the
standard library, redis and rq. With tracing on, it imports OpenTelemetry too (`tracing/otel.py`).
So the API never pulls in llama-cpp-python through it.
"""
