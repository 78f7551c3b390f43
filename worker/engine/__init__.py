"""The model: all that drives llama.cpp (batching, sampling, grammars, prompts), and a model-free one."""
