"""Jobs in Redis: the job store, admission, what each key owns, the workers serving each model
(workers.py), routing to a worker, and the replica check."""
