"""Uploaded files as Redis holds them, beneath the Files routes (api/batches/files.py), the
Batch API and the endpoints that read an uploaded image by its id."""
