"""How jobs reach this worker: the RQ loop, presence announcements, and slots lent to the Batch API."""
