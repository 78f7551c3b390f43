"""Images in jobs: a marker holds an image's place in a message. A job spec names images by their
SHA-256. Their bytes are in Redis at `contract.keys.image`."""
