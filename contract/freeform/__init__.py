"""Custom tools' freeform inputs (the Responses API's `custom` tools, Codex's `apply_patch`).

The input's grammar is a Lark grammar (`lark`) or a regular expression (`regex`). It is read into
plain terms (`terms`). These compile to the GBNF of that text written inside a JSON string
(`escaped`). So every tool protocol carries a custom call as a function call whose one argument is
`input`. The API compiles a tool's format before it enqueues anything (a 400 naming
`tools[i].format`). The worker compiles it again for its sampler, as for schemas
(contract/schema.py)."""
