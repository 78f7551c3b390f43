"""The Redis contract shared by the API and the workers.

Everything one side writes and the other reads is defined here and only here: key names
(`keys`), the job description the API enqueues (`jobspec`), the stream entry format
(`entries`) and the Lua scripts that make writes atomic and fenced (`scripts`). Neither side
may build a key or an entry by hand. This package imports nothing heavier than the standard
library, so the API never pulls in llama-cpp-python through it.
"""
