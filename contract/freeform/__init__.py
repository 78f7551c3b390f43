"""Custom tools' freeform inputs (the Responses API's `custom` tools, Codex's `apply_patch`):
the input's grammar, a Lark grammar (`lark`) or a regular expression (`regex`), read into
plain terms (`terms`) and compiled to the GBNF of that text written inside a JSON string
(`escaped`), so that every tool protocol carries a custom call as a function call whose one
argument is `input`. The API compiles a tool's format before it enqueues anything (a 400
naming `tools[i].format`), and the worker compiles it again for its sampler, as for schemas
(contract/schema.py)."""
