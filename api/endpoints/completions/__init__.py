"""The legacy completions (`POST /v1/completions`): its body and objects. Its events are chat's chunks."""
