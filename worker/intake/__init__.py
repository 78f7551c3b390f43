"""How jobs reach this worker: the RQ loop and presence announcements. It lends slots to the Batch API too."""
