"""Images in prompts: llama.cpp's mtmd encoding an image into embeddings (`encoder.py`), and the
prompt that holds them (`prompt.py`: token ids with an image's rows in place)."""
