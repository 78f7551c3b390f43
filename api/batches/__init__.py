"""The Files and Batch APIs: uploads, a batch's lines run as ordinary jobs, its output files."""
