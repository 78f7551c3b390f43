"""How this API process tends the pool. Its parts: the reaper of dead attempts, resumes, cluster figures."""
