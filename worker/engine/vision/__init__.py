"""Images in prompts. In `encoder.py`, llama.cpp's mtmd encodes an image into embeddings.
`prompt.py` is the prompt that holds them: token ids with an image's rows in place."""
