"""Uploaded files as Redis holds them. They sit beneath the Files routes (api/batches/files.py)
and the Batch API. The endpoints that read an uploaded image by its id use them too."""
