"""`POST /v1/chat/completions`: its body, objects (the chunks) and SSE events, which the
legacy completions share."""
