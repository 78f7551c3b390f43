"""Images in jobs: the marker that holds an image's place in a message, and how a job spec names
images (their SHA-256, the bytes in Redis at `contract.keys.image`)."""
