"""Jobs in Redis. The package holds the job store, admission, and what each key owns. It
also holds the workers serving each model (workers.py) and routing to a worker. The replica
check is here too."""
