"""The pool as this API process tends it: the reaper of dead attempts, the resume rule, cluster figures."""
