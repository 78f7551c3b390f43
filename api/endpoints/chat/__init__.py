"""`POST /v1/chat/completions`: its body, objects (the chunks) and SSE events. The legacy
completions share them."""
