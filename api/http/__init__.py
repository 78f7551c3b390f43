"""HTTP plumbing every route shares: keys, origins, errors, bodies, paging, work off the loop."""
