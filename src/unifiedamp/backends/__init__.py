"""One module per framework; each imports its framework and nothing else does."""
