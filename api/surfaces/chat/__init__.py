"""Chat and legacy text completions: their request bodies, chunks and SSE events."""
