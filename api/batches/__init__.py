"""The Files and Batch APIs: uploads, batch lines run as ordinary jobs, and output files."""
