"""What the chief reads about the running job: each worker's board on ps 0, the watch over
stalls and progress, the progressive validation figures."""
