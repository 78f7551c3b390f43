"""Jobs in Redis: the job store, admission, what each key owns, routing to a worker, and the replica check."""
