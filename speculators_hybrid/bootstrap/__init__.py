"""Directory that `speculators-hybrid run` puts first on `PYTHONPATH` (see `sitecustomize`)."""
