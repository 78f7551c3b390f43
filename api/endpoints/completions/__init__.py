"""The legacy completions (`POST /v1/completions`): its body and objects; its events are chat's chunks."""
